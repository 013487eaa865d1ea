"""The elastic job: rounds of workers that follow the hosts, surviving failures between them.

One loop on the launcher's main thread, in this order each turn: take the workers that exited
(a failure blacklists its host), ask discovery about the hosts about once a second, plan the
slots the usable hosts give (`plan.plan_round`) and, when that plan differs from the running
one, publish it as a new round in the store and start workers for the slots nobody holds.
Running workers learn of the round at their next `state.commit()` (rank 0 reads the store and
tells the others) or, after a peer died, when their `init()` looks for the newest round; workers
the plan leaves out find that out in `init()` and leave. The job ends when a worker of the
current round exits 0 and the others follow; it fails, naming why, below `--min-np` past
`--elastic-timeout`, past `--reset-limit` re-formations, or when every host is blacklisted.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Mapping

from horovod.common.bootstrap.store import last_joined_round, publish_change, publish_round
from horovod.runner.elastic.discovery import HostDiscovery
from horovod.runner.elastic.hosts import HostManager, HostUpdate
from horovod.runner.elastic.plan import as_assignment, plan_round, worker_name
from horovod.runner.hosts import SlotInfo
from horovod.runner.job import Interrupted, Job, JobSpec
from horovod.runner.launchers import WorkerProcess, stop_all
from horovod.runner.report import JobResult, exit_status, how_it_went

DISCOVER_HOSTS_FREQUENCY_SECS = 1.0
# How long the other workers of a finished round may take to exit after the first one did.
_FINISH_GRACE_SECONDS = 60.0
# How long a worker the plan left out may take to leave by itself before it is stopped
# (SIGTERM, repeated until it is gone).
_RETIRE_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class ElasticSpec:
    """What only an elastic job needs, besides the `JobSpec` of every job."""

    discovery: HostDiscovery
    min_np: int
    max_np: int | None = None
    elastic_timeout: float = 600.0
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None


class ElasticDriver(Job):
    """A `Job` whose workers come and go by rounds; use as a context manager, like `Job`."""

    def __init__(self, spec: JobSpec, elastic: ElasticSpec, base_env: Mapping[str, str] | None = None) -> None:
        super().__init__(spec, base_env)
        self.elastic = elastic
        self.hosts = HostManager(elastic.cooldown_range)
        self.resets = 0
        self.round = 0
        self.plan: list[SlotInfo] = []
        self.final_plan: list[SlotInfo] = []  # the round that finished the job
        self._live: dict[str, WorkerProcess] = {}  # by worker id
        self._born: dict[WorkerProcess, int] = {}  # the round each worker was started for
        self._retiring: dict[WorkerProcess, float] = {}  # left out of the plan: stop at this time
        self._all: list[WorkerProcess] = []
        self._exits: queue.Queue[tuple[WorkerProcess, int]] = queue.Queue()
        self._short_since: float | None = None
        self._finishing: float | None = None
        self._finished_round = 0  # the newest round the first worker to finish had joined

    def result_ranks(self) -> list[int]:
        """The first `--min-np` ranks of the round that finished the job (Horovod's choice)."""
        return list(range(min(len(self.final_plan), self.elastic.min_np)))

    def say(self, message: str) -> None:
        print(f"horovodrun: elastic: {message}", file=sys.stderr, flush=True)

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> JobResult:
        assert self.store is not None, "use the driver as a context manager"
        result: JobResult | None = None
        with self._signal_handlers():
            try:
                self.hosts.update(self.elastic.discovery.find_available_hosts(), time.monotonic())
                next_discovery = time.monotonic() + DISCOVER_HOSTS_FREQUENCY_SECS
                while result is None:
                    if self._signum is not None:
                        raise Interrupted(self._signum)
                    exited = self._next_exit(self._exits, 0.1)
                    now = time.monotonic()
                    if exited is not None:
                        result = self._on_exit(*exited, now)
                    elif self._finishing is None and now >= next_discovery:
                        self._discover(now)
                        next_discovery = now + DISCOVER_HOSTS_FREQUENCY_SECS
                    if result is None:
                        result = self._finish_or_replan(now)
            except Interrupted:
                result = JobResult(128 + (self._signum or 0), None, self._signum)
            finally:
                self._raise_on_signal = False
                stop_all(self._all, self.spec.grace_seconds)
                for worker in self._all:
                    worker.join_output(1.0)
        return result

    def _discover(self, now: float) -> None:
        try:
            change = self.hosts.update(self.elastic.discovery.find_available_hosts(), now)
        except (RuntimeError, ValueError) as exc:
            self.say(f"host discovery failed, keeping the last known hosts: {exc}")
            return
        if change:
            self.say(f"hosts changed ({change.name}): now {self._hosts_text(now)}")

    def _on_exit(self, worker: WorkerProcess, returncode: int, now: float) -> JobResult | None:
        name = worker_name(worker.slot)
        if self._retiring.pop(worker, None) is not None or self._live.get(name) is not worker:
            return None  # a worker the plan had already left out
        del self._live[name]
        if returncode == 0:
            if self._finishing is None:
                self._finishing = now
                self._finished_round = last_joined_round(self.store, name)
                self.final_plan = list(self.plan)
                self.say(f"worker {name} finished; waiting for the others of round {self.round}")
            return None
        cooldown = self.hosts.blacklist(worker.slot.hostname, now)
        until = "for good" if cooldown is None else f"for {cooldown:.1f} s"
        self.say(f"worker {name} (rank {worker.slot.rank} of round {self.round}) on host "
                 f"{worker.slot.hostname} {how_it_went(returncode)}; host {worker.slot.hostname} "
                 f"blacklisted {until}")
        if self._finishing is not None or self.hosts.all_blacklisted(now):
            why = None if self._finishing is not None else "every host is blacklisted after failures"
            return self._failed(worker, returncode, why)
        return None

    def _finish_or_replan(self, now: float) -> JobResult | None:
        if self._finishing is not None:
            self._stop_unfinishable(now)
            if not self._live:
                return JobResult(0)
            if now - self._finishing > _FINISH_GRACE_SECONDS:
                return JobResult(1, reason=f"workers {sorted(self._live)} did not finish within "
                                 f"{_FINISH_GRACE_SECONDS:g} s of the first that did")
            return None
        for worker, deadline in self._retiring.items():
            if now > deadline:  # still there: stop it (its exit then means nothing to the job)
                worker.signal(signal.SIGTERM)
        desired = plan_round(self._by_age(self._usable(now)), self.elastic.min_np, self.elastic.max_np)
        if desired is None:
            return self._short(now)
        self._short_since = None
        if [(worker_name(s), s) for s in desired] != [(worker_name(s), s) for s in self.plan]:
            return self._publish(desired, now)
        return None

    def _stop_unfinishable(self, now: float) -> None:
        """Training is complete once a worker has finished. A worker that has joined a newer round
        than the finished one ever did waits for a peer that will never come: stop it, as one the
        plan left out (its exit then means nothing to the job)."""
        for name, worker in list(self._live.items()):
            joined = last_joined_round(self.store, name)
            if joined > self._finished_round:
                self.say(f"worker {name} joined round {joined}, which the finished workers never joined; "
                         "stopping it: the training is complete")
                del self._live[name]
                self._retiring[worker] = now
                worker.signal(signal.SIGTERM)

    def _usable(self, now: float) -> dict[str, int]:
        """The hosts a round may use now: not blacklisted, and not still running workers an earlier
        round left out (a worker id must never be two processes at once)."""
        leaving = {worker.slot.hostname for worker in self._retiring}
        return {host: slots for host, slots in self.hosts.usable(now).items() if host not in leaving}

    def _by_age(self, usable: dict[str, int]) -> dict[str, int]:
        """The usable hosts, those of the longest-running live workers first (then discovery order):
        rank 0, whose state everyone syncs from, must be a worker that has the committed state,
        never a newcomer. A failure blacklists a whole host, so a host's workers are the same age."""
        age: dict[str, int] = {}
        for worker in self._live.values():
            host = worker.slot.hostname
            age[host] = min(age.get(host, self._born[worker]), self._born[worker])
        order = sorted(usable, key=lambda host: (host not in age, age.get(host, 0)))  # stable: ties keep order
        return {host: usable[host] for host in order}

    def _short(self, now: float) -> JobResult | None:
        if self._short_since is None:
            self._short_since = now
            self.say(f"fewer than --min-np {self.elastic.min_np} slots ({self._hosts_text(now)}); waiting up "
                     f"to {self.elastic.elastic_timeout:g} s (--elastic-timeout) for more hosts")
        if now - self._short_since <= self.elastic.elastic_timeout:
            return None
        return JobResult(1, reason=f"timed out after {self.elastic.elastic_timeout:g} s (--elastic-timeout) "
                         f"waiting for --min-np {self.elastic.min_np} slots; usable hosts: {self._hosts_text(now)}")

    def _publish(self, desired: list[SlotInfo], now: float) -> JobResult | None:
        assert self.store is not None
        if self.plan:
            if self.elastic.reset_limit is not None and self.resets >= self.elastic.reset_limit:
                return JobResult(1, reason="Horovod was shutdown because number of resets during elastic "
                                 f"job exceeded limit: {self.elastic.reset_limit}")
            self.resets += 1
        old = {worker_name(slot) for slot in self.plan}
        new = {worker_name(slot) for slot in desired}
        change = (HostUpdate.added if new - old else HostUpdate.no_update) | \
            (HostUpdate.removed if old - new else HostUpdate.no_update)
        self.round = publish_round(self.store, as_assignment(desired))
        publish_change(self.store, self.round, int(change))
        self.plan = desired
        members = ", ".join(f"{slot.rank}={worker_name(slot)}" for slot in desired)
        self.say(f"round {self.round}: {len(desired)} workers (rank=host:slot: {members})")
        for name in old - new:
            worker = self._live.pop(name, None)
            if worker is not None:
                self._retiring[worker] = now + _RETIRE_GRACE_SECONDS
        for slot in desired:
            if worker_name(slot) not in self._live:
                self._launch(slot)
        return None

    def _launch(self, slot: SlotInfo) -> None:
        worker = self._start(slot)
        self._born[worker] = self.round
        self._all.append(worker)
        self._live[worker_name(slot)] = worker
        threading.Thread(target=lambda w=worker: self._exits.put((w, w.wait())),
                         name=f"hvd-wait-{worker_name(slot)}", daemon=True).start()

    def _failed(self, worker: WorkerProcess, returncode: int, why: str | None) -> JobResult:
        described = self._describe(worker, returncode)
        if why is not None:
            return JobResult(1, described, reason=why)
        return JobResult(exit_status(returncode), described)

    def _hosts_text(self, now: float) -> str:
        usable = self.hosts.usable(now)
        return ", ".join(f"{host}:{slots}" for host, slots in usable.items()) or "none"

