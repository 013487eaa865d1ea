"""The ssh launcher: a worker on another host runs under an ssh session started from here."""

from __future__ import annotations

import math
import shlex
from typing import Mapping, Sequence

from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers.base import SECRET_KEY_ENV, LaunchContext
from horovod.runner.launchers.process import ProcessWorker

#: How long a remote worker whose ssh session ended may take to exit after SIGTERM.
WATCH_GRACE_SECONDS = 2


def ssh_argv(
    host: str,
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    port: int | None = None,
    identity_file: str | None = None,
    connect_timeout: float | None = None,
    alive_seconds: float = 0.0,
) -> list[str]:
    """The ssh command that runs `command` on `host` with `env`.

    The job secret is never part of it: the remote shell reads it from stdin (see `SshLauncher`).
    `connect_timeout` (the job's start timeout) bounds how long ssh tries to reach the host, and
    `alive_seconds` (the failure detection setting) how long the session may go unanswered before
    the client gives up (exit status 255), so the launcher learns that a host is cut off even when
    the worker's own exit cannot reach it.
    After the secret, stdin stays open as long as the launcher lives: a watcher in the remote
    shell waits for its end, which comes when the ssh session is gone (the launcher died or
    stopped the ssh client, or the connection broke), and then stops the worker's process group
    (SIGTERM, SIGKILL `WATCH_GRACE_SECONDS` later). sshd starts the remote shell in a session of its
    own, so that group is the worker and whatever it started.
    """
    options = ["-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no"]
    if connect_timeout is not None:
        options += ["-o", f"ConnectTimeout={max(1, math.ceil(connect_timeout))}"]
    if alive_seconds > 0:
        options += ["-o", f"ServerAliveInterval={max(1, math.ceil(alive_seconds / 3))}",
                    "-o", "ServerAliveCountMax=3"]
    if port is not None:
        options += ["-p", str(port)]
    if identity_file is not None:
        options += ["-i", identity_file]
    assignments = " ".join(shlex.quote(f"{name}={value}") for name, value in env.items())
    remote = (
        f"cd {shlex.quote(cwd)} >/dev/null 2>&1; "
        f"IFS= read -r {SECRET_KEY_ENV}; export {SECRET_KEY_ENV}; exec 3<&0; "
        # A background list's stdin is /dev/null unless redirected: hand it the session's (fd 3).
        "{ trap '' TERM; cat >/dev/null; kill -TERM -$$ 2>/dev/null || kill -TERM $$; "
        f"sleep {WATCH_GRACE_SECONDS}; kill -KILL -$$ 2>/dev/null; }} <&3 >/dev/null 2>&1 & "
        f"exec env {assignments} {shlex.join(command)} </dev/null 3<&-"
    )
    return ["ssh", *options, host, remote]


class SshLauncher:
    """Starts each worker through `ssh`; the worker process we watch is the ssh client."""

    def __init__(self, context: LaunchContext) -> None:
        self.context = context

    def start(self, slot: SlotInfo, env: Mapping[str, str]) -> ProcessWorker:
        ctx = self.context
        argv = ssh_argv(
            slot.hostname, ctx.command, env, ctx.cwd,
            port=ctx.ssh_port, identity_file=ctx.ssh_identity_file,
            connect_timeout=ctx.start_timeout, alive_seconds=ctx.failure_detection_seconds,
        )
        # The secret goes over the ssh client's stdin, so no command line or remote `ps` shows it;
        # stdin then stays open: its end tells the remote side that the launcher is gone.
        return ProcessWorker(slot, argv, ctx.launcher_env, stdin_data=(ctx.secret_hex + "\n").encode(),
                             output=ctx.output, guard=ctx.guard, keep_stdin_open=True)
