"""One fixed-size job: the rendezvous store, one worker per slot, and the failure policy.

The policy is Horovod's: the first worker to exit non-zero ends the job. The launcher records
every exit in the store (`lost/<rank>`), so ranks still setting up fail at once naming the rank
instead of waiting for it; gives the others a moment to notice and exit on their own (their own
errors name the failed rank); then stops what is left (SIGTERM, then SIGKILL) and reports the
root cause at the very end of the output: the first failure that is not a consequence of another,
whatever order the processes exited in (`report.root_cause`), with the exception the rank recorded
in the store (`failures/<rank>`, see docs/internals.md) or, failing that, its stderr's last lines.
It also enforces the start timeout: once one rank has called hvd.init(), every rank must within
`start_timeout` seconds, or the job stops naming those that did not. A signal to the launcher
(Ctrl-C, SIGTERM, SIGHUP) stops every worker before the launcher exits, so no process outlives
the job; a launcher killed outright leaves that to the job's orphan guard (`launchers.orphans`). How a worker is started, watched and stopped is not decided here: each host's launcher
comes by name from `horovod.runner.launchers`, and the policy sees workers only as `WorkerProcess`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from horovod.common import netif, wire
from horovod.common.rendezvous import JOINED, LOST, RendezvousServer, encode_lost
from horovod.common.settings import DEFAULT_FAILURE_DETECTION_SECONDS
from horovod.runner import launchers, network
from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers import SECRET_KEY_ENV, LaunchContext, Launcher, OutputOptions, WorkerProcess
from horovod.runner.launchers.orphans import OrphanGuard
from horovod.runner.report import JobResult, WorkerFailure, exit_status, how_it_went, root_cause

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_OUTPUT_DRAIN_SECONDS = 5.0
# How often the launcher looks at the store while it waits for workers (start timeout).
_WATCH_SECONDS = 0.25


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
    env.update(slot.topology().variables())
    env.update(
        HOROVOD_GLOO_RENDEZVOUS_ADDR=rendezvous_addr,
        HOROVOD_GLOO_RENDEZVOUS_PORT=str(rendezvous_port),
        HOROVOD_CONTROLLER="gloo",
        PYTHONUNBUFFERED="1",
        # Said outright, so that no other launcher's variables the worker inherits (a torchrun or a
        # PyTorchJob pod that runs horovodrun, an MPI job around it) can make it join elsewhere.
        HOROVOD_BOOTSTRAP=extra.get("HOROVOD_BOOTSTRAP", "env"),
    )
    return env


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
    # After the first failure, how long the other workers get to notice it and exit by themselves
    # before they are stopped: their own errors then name the failed rank.
    failure_grace_seconds: float = 2.0
    start_timeout: float = 30.0
    failure_detection_seconds: float = DEFAULT_FAILURE_DETECTION_SECONDS
    # Which launcher starts every worker (`horovod.runner.launchers`); None: by host, local or ssh.
    launcher: str | None = None
    # Where the store listens; None: chosen from the hosts (a launcher whose hosts are not network
    # names, such as Ray's node ids, gives it).
    store_address: str | None = None
    # What each worker reserves where its launcher schedules it (Ray: {"CPU": 1, "GPU": 0}).
    worker_resources: Mapping[str, float] = field(default_factory=dict)
    # What a launcher that is not chosen by host needs besides (Spark: how to reach its tasks).
    launcher_options: Mapping[str, str] = field(default_factory=dict)


class Interrupted(Exception):
    """A stop signal reached the launcher while it waited for workers."""

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
        self._secret = wire.new_secret_key()
        self._guard = OrphanGuard()
        self._launch_context = LaunchContext(
            command=spec.command, secret_hex=self._secret.hex(), cwd=os.getcwd(),
            launcher_env=self._base_env, output=spec.output, start_timeout=spec.start_timeout,
            failure_detection_seconds=spec.failure_detection_seconds,
            ssh_port=spec.ssh_port, ssh_identity_file=spec.ssh_identity_file,
            resources=spec.worker_resources,
            launcher_options=spec.launcher_options, guard=self._guard,
        )
        self._launchers: dict[str, Launcher] = {}  # by launcher name, built on first use
        self.store: RendezvousServer | None = None
        self.address = ""
        self.port = 0
        # Signal bookkeeping: a handler only raises while the main thread waits for workers.
        self._signum: int | None = None
        self._raise_on_signal = False

    # -- store -------------------------------------------------------------------------------
    def _advertised_address(self) -> str:
        if self.spec.store_address is not None:
            return self.spec.store_address
        local = {slot.hostname: network.is_local_host(slot.hostname) for slot in self.spec.slots}
        if all(local.values()):
            return "127.0.0.1"
        # The first of the named interfaces this machine has; else (a launcher on a machine whose
        # names differ) the route towards the hosts.
        own = {interface.name: interface.address for interface in netif.interfaces()}
        named = [own[nic] for nic in self.spec.nics if nic in own]
        if named:
            return named[0]
        remote = next(host for host, is_local in local.items() if not is_local)
        return network.address_towards(remote)

    def __enter__(self) -> "Job":
        # The store listens only where workers are told to reach it: loopback for a one-host job,
        # else the one address that reaches this machine from the remote hosts.
        self.address = self._advertised_address()
        self.store = RendezvousServer(self._secret, self.address, self.spec.failure_detection_seconds)
        self.port = self.store.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._guard.close()  # every worker is stopped by now (`run`)
        if self.store is not None:
            self.store.stop()

    # -- workers -----------------------------------------------------------------------------
    def _start(self, slot: SlotInfo) -> WorkerProcess:
        env = worker_env(self._base_env, self.spec.extra_env, slot, self.address, self.port)
        name = self.spec.launcher or launchers.default_name(slot.hostname)
        if name not in self._launchers:
            self._launchers[name] = launchers.create(name, self._launch_context)
        return self._launchers[name].start(slot, env)

    def _say(self, message: str) -> None:
        if self.spec.verbose:
            print(f"horovodrun: {message}", file=sys.stderr, flush=True)

    def run(self) -> JobResult:
        """Start every worker, wait for all of them or for the first failure, and clean up."""
        assert self.store is not None, "use the job as a context manager"
        workers: list[WorkerProcess] = []
        exits: queue.Queue[tuple[WorkerProcess, int]] = queue.Queue()
        failure: tuple[WorkerProcess, str | None] | None = None  # the first to fail, and why we stopped it
        failed: list[WorkerProcess] = []  # every worker that failed by itself, in exit order
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
                running = {worker.slot.rank for worker in workers} if self._signum is None else set()
                first_join: float | None = None
                while running and failure is None:
                    exited = self._next_exit(exits, _WATCH_SECONDS)
                    if exited is None:
                        first_join, failure = self._check_start(workers, first_join)
                        continue
                    worker, returncode = exited
                    running.discard(worker.slot.rank)
                    self._record_exit(worker, returncode)
                    if returncode != 0:
                        failed.append(worker)
                        failure = (worker, None)
                finished = not running and failure is None and self._signum is None
                if failure is not None:
                    # The others learn of the failure through their connections (or `lost/`): let
                    # them report it and exit by themselves, briefly, before stopping them.
                    deadline = time.monotonic() + self.spec.failure_grace_seconds
                    while running and time.monotonic() < deadline:
                        exited = self._next_exit(exits, deadline - time.monotonic())
                        if exited is not None:
                            running.discard(exited[0].slot.rank)
                            self._record_exit(*exited)
                            if exited[1] != 0:
                                failed.append(exited[0])
            except Interrupted:
                pass
            finally:
                self._raise_on_signal = False
                if not finished:
                    self._say("stopping the remaining workers")
                # Also after a success: whatever a worker left running in its process group goes too.
                launchers.stop_all(workers, self.spec.grace_seconds)
                deadline = time.monotonic() + _OUTPUT_DRAIN_SECONDS
                for worker in workers:
                    worker.join_output(max(0.0, deadline - time.monotonic()))
        if failure is not None:
            worker, reason = failure if failure[1] else self._first_cause(failed, workers)
            described = dataclasses.replace(self._describe(worker, worker.returncode or 0), reason=reason)
            return JobResult(1 if reason else exit_status(described.returncode), described, self._signum)
        if self._signum is not None:
            return JobResult(128 + self._signum, None, self._signum)
        return JobResult(0)

    def result_ranks(self) -> list[int]:
        """The ranks whose `horovod.run` results the caller gets, in order: every rank."""
        return [slot.rank for slot in self.spec.slots]

    def _next_exit(self, exits: "queue.Queue[tuple[WorkerProcess, int]]",
                   timeout: float) -> tuple[WorkerProcess, int] | None:
        """The next worker to exit within `timeout` seconds, or None; a signal interrupts the wait."""
        self._raise_on_signal = True  # set before the check: no signal slips between
        try:
            if self._signum is not None:
                raise Interrupted(self._signum)
            return exits.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        finally:
            self._raise_on_signal = False

    def _record_exit(self, worker: WorkerProcess, returncode: int) -> None:
        """Tell ranks still setting up that this one is gone, so they stop waiting for it."""
        self._lost(worker.slot, how_it_went(returncode))

    def _lost(self, slot: SlotInfo, what: str) -> None:
        assert self.store is not None
        if self.store.get(LOST, str(slot.rank)) is None:
            order = len(self.store.keys(LOST))
            self.store.put(LOST, str(slot.rank), encode_lost(order, slot.hostname, what))

    def _check_start(self, workers: Sequence[WorkerProcess], first_join: float | None
                     ) -> tuple[float | None, tuple[WorkerProcess, str] | None]:
        """The start timeout: once a rank has called hvd.init(), all must within `start_timeout`."""
        assert self.store is not None
        joined = {int(key) for key in self.store.keys(JOINED) if key.isdigit()}
        if not joined:
            return first_join, None
        now = time.monotonic()
        if first_join is None:
            return now, None
        missing = [worker for worker in workers if worker.slot.rank not in joined]
        if not missing or now - first_join <= self.spec.start_timeout:
            return first_join, None
        what = (f"did not join the job within the start timeout ({self.spec.start_timeout:g} s, --start-timeout "
                f"or HOROVOD_START_TIMEOUT) "
                "of the first rank that did (it has not called hvd.init(), or cannot reach the rendezvous store)")
        for worker in missing:
            self._lost(worker.slot, what)
        ranks = ", ".join(str(worker.slot.rank) for worker in missing)
        self._say(f"ranks {ranks} did not join in time; stopping the job")
        return first_join, (missing[0], f"{what}; it was stopped")

    def _first_cause(self, failed: list[WorkerProcess], workers: Sequence[WorkerProcess]
                     ) -> tuple[WorkerProcess, str | None]:
        """The failure to report, whatever order the processes exited in (`report.root_cause`)."""
        assert self.store is not None
        reports = set(self.store.keys("failures"))
        # A rank that recorded its own exception but was still exiting when the rest were stopped
        # failed by itself too; it only lost the race to the exit.
        exited = {worker.slot.rank for worker in failed}
        late = [worker for worker in workers if worker.slot.rank not in exited
                and str(worker.slot.rank) in reports and f"after.{worker.slot.rank}" not in reports]
        candidates = {worker.slot.rank: worker for worker in failed + late}
        chosen = candidates[root_cause(list(candidates), reports)]
        return chosen, ("it reported an exception and was still exiting when the job was stopped"
                        if chosen in late else None)

    def _describe(self, worker: WorkerProcess, returncode: int) -> WorkerFailure:
        assert self.store is not None
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
                raise Interrupted(signum)

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
