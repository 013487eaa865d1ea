"""The launcher seam: "start this worker with this environment, tell me when it exits, stop it".

A launcher knows how to get one worker process running somewhere (a child of this process, an
ssh session, later mpirun, a Spark task or a Ray actor); it knows nothing of what to do when a
worker fails. That policy lives in `horovod.runner.job`, which sees every worker only through
`WorkerProcess`, the way torch.distributed.elastic keeps process handling apart from restarts.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers.orphans import OrphanGuard

#: The variable that hands the job's secret to a worker (read by `horovod.common.settings`).
SECRET_KEY_ENV = "_HOROVOD_SECRET_KEY"


@dataclass(frozen=True)
class OutputOptions:
    """How worker output is shown: `--prefix-output-with-timestamp` and `--output-filename`."""

    prefix_timestamp: bool = False
    output_dir: str | None = None
    tail_lines: int = 20


@dataclass(frozen=True)
class LaunchContext:
    """What every launcher of one job shares; each launcher reads the fields that concern it."""

    command: tuple[str, ...]
    secret_hex: str  # the job's secret; each launcher hands it over its own way, never on a command line
    cwd: str  # where the workers start (the launcher's own working directory)
    launcher_env: Mapping[str, str] = field(default_factory=dict)  # for helpers the launcher runs (ssh)
    output: OutputOptions = OutputOptions()
    start_timeout: float = 30.0  # also bounds how long a remote connection may take
    failure_detection_seconds: float = 0.0  # how long an ssh session may go unanswered (0: ssh's own rules)
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict)  # each worker's reservation (Ray)
    # What a launcher that is not chosen by host needs besides (the Spark launcher: how to reach
    # the tasks that host the workers); see `JobSpec.launcher`.
    launcher_options: Mapping[str, str] = field(default_factory=dict)
    # Stops the workers a launcher starts as its own processes should the launcher die (`orphans`).
    guard: OrphanGuard | None = None


class WorkerProcess(Protocol):
    """One started worker as the failure policy sees it, whatever launched it."""

    @property
    def slot(self) -> SlotInfo: ...

    @property
    def returncode(self) -> int | None:
        """The exit status once the worker has exited (negative: killed by that signal)."""

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the worker exits (its return code), or None when `timeout` passes first."""

    def signal(self, signum: int) -> None:
        """Signal the worker and everything it started; a worker already gone is fine."""

    def join_output(self, timeout: float) -> None:
        """Wait until everything the worker printed has been forwarded."""

    def stderr_tail(self) -> list[str]:
        """The last lines the worker wrote to stderr, for the failure report."""


class Launcher(Protocol):
    """Starts the workers of one job; built by name as `Cls(context)` (see `registry`)."""

    def start(self, slot: SlotInfo, env: Mapping[str, str]) -> WorkerProcess:
        """Start the worker of `slot` with exactly `env` (plus the job's secret)."""


def stop_all(workers: Sequence[WorkerProcess], grace_seconds: float = 5.0) -> None:
    """SIGTERM every worker's group, then SIGKILL what is left after `grace_seconds`."""
    for worker in workers:
        worker.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for worker in workers:
        worker.wait(timeout=max(0.0, deadline - time.monotonic()))
    for worker in workers:
        # Also reaches children a worker left behind after it exited itself.
        worker.signal(signal.SIGKILL)
    for worker in workers:
        worker.wait()
