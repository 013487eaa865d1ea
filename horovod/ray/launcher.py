"""The `ray` launcher: a worker is a Ray actor on the node its slot's host names.

Registered in `horovod.runner.launchers` so that the runner's failure policy and the elastic
driver (`horovod.runner.elastic`) start Ray workers exactly as they start processes: a slot's
host is a Ray node id, the worker's environment reaches the actor as Ray's `runtime_env`, and the
worker runs `horovod.runner.run_task` (the function of `horovod.run`, from the store) in the actor.
Ray forwards the actor's output to the driver itself, so there is no output to join here.
"""

from __future__ import annotations

import signal
import threading
from typing import Any, Mapping

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from horovod.ray.worker import BaseHorovodWorker
from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers.base import SECRET_KEY_ENV, LaunchContext


class RayWorkerProcess:
    """One worker actor as the failure policy sees it (`horovod.runner.launchers.WorkerProcess`)."""

    def __init__(self, slot: SlotInfo, actor: Any, done: Any) -> None:
        self._slot = slot
        self._actor = actor
        self._done = done  # the ObjectRef of the actor's run_task(): its exit status
        self._returncode: int | None = None
        self._killed: int | None = None  # the signal that made us kill the actor
        self._tail: list[str] = []
        self._lock = threading.Lock()

    @property
    def slot(self) -> SlotInfo:
        return self._slot

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self._returncode is not None:
            return self._returncode
        ready, _ = ray.wait([self._done], timeout=timeout)
        if not ready:
            return None
        try:
            code = int(ray.get(self._done))
        except RayActorError as exc:  # killed by us, or its node or process went away: no exit status
            code = -(self._killed if self._killed is not None else signal.SIGKILL)
            self._tail = [f"the worker's Ray actor died: {exc}"]
        except RayTaskError as exc:
            code, self._tail = 1, str(exc).splitlines()[-20:]
        with self._lock:
            if self._returncode is None:
                self._returncode = code
                ray.kill(self._actor, no_restart=True)  # the task is over: free the process and its CPUs
        return self._returncode

    def signal(self, signum: int) -> None:
        """Any stop signal ends the actor at once (Ray has no gentler way to stop a running task)."""
        if self._returncode is None and self._killed is None:
            self._killed = signum if signum > 0 else signal.SIGKILL
            ray.kill(self._actor, no_restart=True)

    def join_output(self, timeout: float) -> None:
        return None

    def stderr_tail(self) -> list[str]:
        return list(self._tail)


class RayLauncher:
    """Starts each worker as an actor pinned to the node named by its slot's host."""

    def __init__(self, context: LaunchContext) -> None:
        self.context = context

    def start(self, slot: SlotInfo, env: Mapping[str, str]) -> RayWorkerProcess:
        resources = self.context.resources
        actor = ray.remote(BaseHorovodWorker).options(
            num_cpus=resources.get("CPU", 1), num_gpus=resources.get("GPU", 0),
            scheduling_strategy=NodeAffinitySchedulingStrategy(slot.hostname, soft=False),
            runtime_env={"env_vars": {**env, SECRET_KEY_ENV: self.context.secret_hex}}, max_restarts=0,
        ).remote(slot.rank, slot.size)
        return RayWorkerProcess(slot, actor, actor.run_task.remote())
