"""When the launcher dies, its workers go too: the orphan guard and the parent-death signal.

Workers run in sessions of their own (so a Ctrl-C reaches only the launcher, which stops them in
order). The price: a launcher that is SIGKILLed, or crashes, stops nobody, and its workers would
run on, holding their GPUs, until they next need the launcher. The guard closes that gap for the
workers a launcher starts as its own processes (local workers, and the ssh clients of remote
ones): a small process, started beside the first worker, in a session of its own, that reads
the process group of every worker from a pipe whose other end only the launcher holds. The
pipe's end (EOF) without a goodbye means the launcher is gone, however it went: the guard says
so on the launcher's stderr, SIGTERMs every worker group, and SIGKILLs what is left after
`GRACE_SECONDS`. Remote workers then go with their ssh session (see `launchers.ssh`).
Workers in Spark tasks go the same way (`stop_groups`) when their task loses the driver's
control store (see `horovod.spark.task`).

This file runs as a script (`python -I orphans.py <launcher pid>`), so it imports only the
standard library: the guard must start whatever `horovod` the workers import.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable

#: How long a worker group may take to exit after SIGTERM before the guard SIGKILLs it. With the
#: guard noticing at once (EOF), every worker is gone well within 5 s of its launcher.
GRACE_SECONDS = 2.0
_POLL_SECONDS = 0.05
_PR_SET_PDEATHSIG = 1

try:  # looked up before any fork, so a child runs no more Python than one call
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None  # not Linux


def parent_death_signal(signum: int) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the kernel send `signum` to the child when the thread that started
    it exits (Linux `PR_SET_PDEATHSIG`); None where the platform has no such signal."""
    if _prctl is None:
        return None
    prctl = _prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signum)

    return arm


class OrphanGuard:
    """The launcher's side: `watch()` each worker's process group, `close()` when the job is over."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def watch(self, process_group: int, rank: int, host: str) -> None:
        """Stop this group if the launcher dies before `close()` (starts the guard on first use)."""
        with self._lock:
            if self._proc is None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid())],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
                )
            self._send(f"watch {process_group} {rank} {host}\n")

    def close(self) -> None:
        """The job is over and its workers stopped: let the guard go without touching anything."""
        with self._lock:
            if self._proc is None:
                return
            self._send("bye\n")
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()
            except OSError:
                pass
            self._proc.wait()
            self._proc = None

    def _send(self, line: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(line.encode())
            self._proc.stdin.flush()
        except OSError:  # the guard died (someone killed it): the workers lose this safety net only
            pass


# -- the guard process --------------------------------------------------------------------------

def _live_members(groups: Iterable[int]) -> set[int]:
    """The groups among `groups` that still have a running (not zombie) process."""
    groups = set(groups)
    if not os.path.isdir("/proc/self"):  # no /proc: ask the kernel group by group
        alive = set()
        for group in groups:
            try:
                os.killpg(group, 0)
                alive.add(group)
            except (ProcessLookupError, PermissionError):
                pass
        return alive
    alive = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) in groups:
            alive.add(int(fields[2]))
    return alive


def _signal_groups(groups: Iterable[int], signum: int) -> None:
    for group in groups:
        try:
            os.killpg(group, signum)
        except (ProcessLookupError, PermissionError):
            pass


def stop_groups(reason: str, workers: dict[int, str]) -> None:
    """Say on stderr `reason` and whom it stops, then stop every live group of `workers` (group ->
    who): SIGTERM, and SIGKILL what is left after `GRACE_SECONDS`. For whoever finds that the
    workers' launcher is gone (the guard; a Spark task that lost its driver)."""
    alive = _live_members(workers)
    if not alive:
        return
    who = "; ".join(workers[group] for group in sorted(alive))
    print(f"{reason}: {who}", file=sys.stderr, flush=True)
    _signal_groups(alive, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
        alive = _live_members(alive)
    _signal_groups(alive, signal.SIGKILL)


def stop_orphans(launcher_pid: int, workers: dict[int, str]) -> None:
    """The launcher is gone: say so, then stop every worker group (`workers`: group -> who)."""
    stop_groups(f"horovodrun: the launcher (pid {launcher_pid}) exited without stopping its workers (killed, or "
                "it crashed); stopping them so that none outlives it", workers)


def main(argv: list[str]) -> int:
    """Read `watch <group> <rank> <host>` lines until `bye` (all is well) or EOF (launcher gone)."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # only the launcher's death ends the watch
    launcher_pid = int(argv[1])
    workers: dict[int, str] = {}
    for line in sys.stdin.buffer:
        word, *rest = line.decode("utf-8", errors="replace").split()
        if word == "bye":
            return 0
        if word == "watch" and len(rest) == 3 and rest[0].isdigit():
            workers[int(rest[0])] = f"rank {rest[1]} on host {rest[2]} (process group {rest[0]})"
    stop_orphans(launcher_pid, workers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
