"""One fixed-size job: the rendezvous store, one worker per slot, and the failure policy.

The policy is Horovod's: the first worker to exit non-zero ends the job. The launcher stops the
others (SIGTERM, then SIGKILL) and reports that first failure at the very end of the output,
with the exception the rank recorded in the store (`failures/<rank>`, see docs/internals.md)
or, failing that, the last lines of its stderr. A signal to the launcher (Ctrl-C, SIGTERM,
SIGHUP) stops every worker before the launcher exits, so no process outlives the job.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from horovod.common import wire
from horovod.common.rendezvous import RendezvousServer
from horovod.runner import local_launcher, network
from horovod.runner.hosts import SlotInfo
from horovod.runner.local_launcher import OutputOptions, Worker

SECRET_KEY_ENV = "_HOROVOD_SECRET_KEY"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_OUTPUT_DRAIN_SECONDS = 5.0


def _inherited(name: str) -> bool:
    """Which launcher variables a worker must not inherit (Horovod's list, plus the old secret)."""
    return not (
        name.startswith("BASH_FUNC_")
        or name == "OLDPWD"
        or name.endswith("CUDA_VISIBLE_DEVICES")
        or name == SECRET_KEY_ENV
    )


def worker_env(
    base: Mapping[str, str],
    extra: Mapping[str, str],
    slot: SlotInfo,
    rendezvous_addr: str,
    rendezvous_port: int,
) -> dict[str, str]:
    """The environment of one worker, without the secret (the caller adds it its own way)."""
    env = {name: value for name, value in base.items() if _inherited(name)}
    env.update(extra)
    env.update(
        HOROVOD_HOSTNAME=slot.hostname,
        HOROVOD_RANK=str(slot.rank),
        HOROVOD_SIZE=str(slot.size),
        HOROVOD_LOCAL_RANK=str(slot.local_rank),
        HOROVOD_LOCAL_SIZE=str(slot.local_size),
        HOROVOD_CROSS_RANK=str(slot.cross_rank),
        HOROVOD_CROSS_SIZE=str(slot.cross_size),
        HOROVOD_GLOO_RENDEZVOUS_ADDR=rendezvous_addr,
        HOROVOD_GLOO_RENDEZVOUS_PORT=str(rendezvous_port),
        HOROVOD_CONTROLLER="gloo",
        PYTHONUNBUFFERED="1",
    )
    return env


def describe_returncode(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def exit_status(returncode: int) -> int:
    """The launcher's own exit status for a worker's return code (128+N for signal N, as shells do)."""
    return returncode if returncode > 0 else 128 - returncode


@dataclass(frozen=True)
class WorkerFailure:
    """The first worker that exited non-zero, with what we know about why."""

    rank: int
    hostname: str
    local_rank: int
    returncode: int
    stderr_tail: tuple[str, ...] = ()
    reported_exception: str | None = None
    other_reporting_ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    failure: WorkerFailure | None = None
    signal_received: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def format_failure(failure: WorkerFailure) -> str:
    """The summary printed last, so the cause is the first thing a user sees when scrolling up."""
    lines = [
        "Horovod detected that one or more processes exited with non-zero status, so the job "
        "was stopped. The first process to fail was:",
        f"    rank {failure.rank} on host {failure.hostname} (local rank {failure.local_rank}): "
        f"{describe_returncode(failure.returncode)}",
    ]
    if failure.reported_exception:
        lines.append(f"Root cause, the exception rank {failure.rank} reported:")
        lines += ["    " + line for line in failure.reported_exception.rstrip().splitlines()]
    tail = failure.stderr_tail
    if failure.reported_exception:
        reported = {line.strip() for line in failure.reported_exception.splitlines()}
        if all(line.strip() in reported for line in tail):
            tail = ()  # the stderr tail is only the traceback already shown
    if tail:
        lines.append(f"Last {len(tail)} lines of rank {failure.rank}'s stderr:")
        lines += ["    " + line for line in tail]
    elif not failure.reported_exception:
        lines.append(f"Rank {failure.rank} wrote nothing to stderr.")
    if failure.other_reporting_ranks:
        ranks = ", ".join(str(rank) for rank in failure.other_reporting_ranks)
        lines.append(f"Other ranks that reported an exception: {ranks}.")
    return "\n".join(lines)


def format_result(result: JobResult) -> str | None:
    """What the launcher prints at the end of a job that did not succeed (None when it did)."""
    if result.failure is not None:
        return format_failure(result.failure)
    if result.signal_received is not None:
        name = signal.Signals(result.signal_received).name
        return f"horovodrun received {name}; all worker processes were stopped."
    return None


@dataclass(frozen=True)
class JobSpec:
    """Everything needed to start the workers of a job."""

    command: tuple[str, ...]
    slots: tuple[SlotInfo, ...]
    extra_env: Mapping[str, str] = field(default_factory=dict)
    output: OutputOptions = OutputOptions()
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    nics: tuple[str, ...] = ()
    verbose: bool = False
    grace_seconds: float = 5.0


class _Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Job:
    """Use as a context manager: the store lives as long as the `with` block."""

    def __init__(self, spec: JobSpec, base_env: Mapping[str, str] | None = None) -> None:
        if not spec.command:
            raise ValueError("no command given to run on the workers")
        self.spec = spec
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._local = {slot.hostname: network.is_local_host(slot.hostname) for slot in spec.slots}
        self._secret = wire.new_secret_key()
        self.store = RendezvousServer(self._secret, self._bind_address())
        self.address = ""
        self.port = 0
        # Signal bookkeeping: a handler only raises while the main thread waits for workers.
        self._signum: int | None = None
        self._raise_on_signal = False

    # -- store -------------------------------------------------------------------------------
    def _bind_address(self) -> str:
        return "127.0.0.1" if all(self._local.values()) else "0.0.0.0"

    def _advertised_address(self) -> str:
        if all(self._local.values()):
            return "127.0.0.1"
        if self.spec.nics:
            return network.interface_address(self.spec.nics[0])
        remote = next(host for host, local in self._local.items() if not local)
        return network.address_towards(remote)

    def __enter__(self) -> "Job":
        self.port = self.store.start()
        try:
            self.address = self._advertised_address()
        except BaseException:
            self.store.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.store.stop()

    # -- workers -----------------------------------------------------------------------------
    def _start(self, slot: SlotInfo) -> Worker:
        env = worker_env(self._base_env, self.spec.extra_env, slot, self.address, self.port)
        cwd = os.getcwd()
        if self._local[slot.hostname]:
            env[SECRET_KEY_ENV] = self._secret.hex()
            return Worker(slot, self.spec.command, env, cwd=cwd, output=self.spec.output)
        argv = local_launcher.ssh_argv(
            slot.hostname, self.spec.command, env, cwd,
            port=self.spec.ssh_port, identity_file=self.spec.ssh_identity_file,
        )
        return Worker(slot, argv, self._base_env, stdin_data=(self._secret.hex() + "\n").encode(),
                      output=self.spec.output)

    def _say(self, message: str) -> None:
        if self.spec.verbose:
            print(f"horovodrun: {message}", file=sys.stderr, flush=True)

    def run(self) -> JobResult:
        """Start every worker, wait for all of them or for the first failure, and clean up."""
        workers: list[Worker] = []
        exits: queue.Queue[tuple[Worker, int]] = queue.Queue()
        first_failure: tuple[Worker, int] | None = None
        self._say(f"rendezvous store at {self.address}:{self.port}; command: {' '.join(self.spec.command)}")
        finished = False  # every worker exited 0: nothing to stop
        with self._signal_handlers():
            try:
                for slot in self.spec.slots:
                    if self._signum is not None:
                        break
                    self._say(
                        f"rank {slot.rank} -> {slot.hostname} (local rank {slot.local_rank}/"
                        f"{slot.local_size}, cross rank {slot.cross_rank}/{slot.cross_size})"
                    )
                    worker = self._start(slot)
                    workers.append(worker)
                    threading.Thread(target=lambda w=worker: exits.put((w, w.wait())),
                                     name=f"hvd-wait-{slot.rank}", daemon=True).start()
                pending = len(workers) if self._signum is None else -1
                while pending > 0:
                    self._raise_on_signal = True  # set before the check: no signal slips between
                    if self._signum is not None:
                        break
                    worker, returncode = exits.get()
                    self._raise_on_signal = False
                    pending -= 1
                    if returncode != 0:
                        first_failure = (worker, returncode)
                        break
                finished = pending == 0 and first_failure is None
            except _Interrupted:
                pass
            finally:
                self._raise_on_signal = False
                if not finished:
                    self._say("stopping the remaining workers")
                    local_launcher.terminate(workers, self.spec.grace_seconds)
                for worker in workers:
                    worker.join_output(_OUTPUT_DRAIN_SECONDS)
        if first_failure is not None:
            failure = self._describe(*first_failure)
            return JobResult(exit_status(failure.returncode), failure, self._signum)
        if self._signum is not None:
            return JobResult(128 + self._signum, None, self._signum)
        return JobResult(0)

    def _describe(self, worker: Worker, returncode: int) -> WorkerFailure:
        rank = worker.slot.rank
        report = self.store.get("failures", str(rank))
        others = tuple(sorted(int(key) for key in self.store.keys("failures")
                              if key.isdigit() and int(key) != rank))
        return WorkerFailure(
            rank=rank,
            hostname=worker.slot.hostname,
            local_rank=worker.slot.local_rank,
            returncode=returncode,
            stderr_tail=tuple(worker.stderr_tail()),
            reported_exception=report.decode("utf-8", errors="replace") if report else None,
            other_reporting_ranks=others,
        )

    # -- signals -----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: object) -> None:
        if self._signum is None:
            self._signum = signum
            if self._raise_on_signal:
                self._raise_on_signal = False
                raise _Interrupted(signum)

    @contextlib.contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        # Python lets only the main thread install handlers; elsewhere (horovod.run called from
        # another thread) the caller's own signal handling applies.
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for signum in _STOP_SIGNALS:
                previous[signum] = signal.signal(signum, self._on_signal)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
