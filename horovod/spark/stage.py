"""The driver side of the Spark stage that hosts the workers of one `horovod.spark.run`.

`TaskStage` is what both kinds of stage share; `BarrierStage` is `run`'s (all tasks together or
none), `horovod.spark.elastic.ElasticStage` is `run_elastic`'s (tasks come and go). The stage is
submitted from a thread of its own (Spark's `collect` blocks until every task is done) under a
job group of its own, so it can be cancelled: when the tasks do not all start in time (barrier
mode starts all of them together or none, so too few free slots means none start), and whenever
the run ends before the stage did. A task that Spark loses never reports its
worker's exit itself; once the stage is over, the driver reports it for them (`LOST_TASK`) so the
failure policy sees the worker gone instead of waiting for it.
"""

from __future__ import annotations

import abc
import threading
import time
import uuid
from typing import Any

from horovod.common.rendezvous import RendezvousServer
from horovod.spark import control
from horovod.spark.control import ControlAddress
from horovod.spark.task import barrier_task

_STOP_SECONDS = 30.0


class TaskStage(abc.ABC):
    """`num_proc` tasks, each ready to host workers, submitted and cancelled as one Spark job
    group; use as a context manager."""

    def __init__(self, spark_context: Any, num_proc: int, store: RendezvousServer, address: ControlAddress,
                 start_timeout: float) -> None:
        self._sc, self.num_proc, self._store = spark_context, num_proc, store
        self._address, self._start_timeout = address, start_timeout
        self._group = f"horovod.spark.run-{uuid.uuid4().hex[:12]}"
        self._thread = threading.Thread(target=self._run, name="hvd-spark-stage", daemon=True)
        self.error: BaseException | None = None

    @abc.abstractmethod
    def _submit(self, rdd: Any) -> None:
        """Run the tasks over `rdd` (one partition each) until they are all done."""

    @abc.abstractmethod
    def _unreported(self) -> list[str]:
        """The worker keys (`control.EXIT`) no task will report on once the stage is over."""

    def __enter__(self) -> "TaskStage":
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # After a run, every worker has exited and the tasks return at once; after an error some
        # may still wait for a worker that will never come: cancel them.
        if exc_type is None:
            self._thread.join(_STOP_SECONDS)
        if self._thread.is_alive():
            self._sc.cancelJobGroup(self._group)
            self._thread.join(_STOP_SECONDS)

    def _run(self) -> None:
        self._sc.setJobGroup(self._group, "horovod.spark.run: one task per Horovod rank", interruptOnCancel=True)
        try:
            self._submit(self._sc.parallelize(range(self.num_proc), self.num_proc))
        except BaseException as exc:  # reported while waiting for the tasks / to the failure policy
            self.error = exc
        finally:
            for key in self._unreported():
                self._store.put(control.EXIT, key, str(control.LOST_TASK).encode())

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


class BarrierStage(TaskStage):
    """`run`'s stage: `num_proc` barrier tasks, each hosting one worker, task index = key."""

    def _submit(self, rdd: Any) -> None:
        rdd.barrier().mapPartitions(barrier_task(self._address, self._start_timeout)).collect()

    def _unreported(self) -> list[str]:
        return [str(index) for index in range(self.num_proc) if self._store.get(control.EXIT, str(index)) is None]

    def wait_registered(self) -> dict[int, str]:
        """The host of every task, once all have started; a clear error when they do not in time."""
        deadline = time.monotonic() + self._start_timeout
        while True:
            registered = self._store.keys(control.TASKS)
            if len(registered) == self.num_proc:
                return {int(key): (self._store.get(control.TASKS, key) or b"").decode() for key in registered}
            if self.error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the Spark stage hosting the {self.num_proc} Horovod tasks failed before "
                                   f"they all started (barrier mode starts them together, so the cluster needs "
                                   f"{self.num_proc} free task slots at once): {spark_message(self.error)}")
            if time.monotonic() > deadline:
                self._sc.cancelJobGroup(self._group)
                raise TimeoutError(
                    f"only {len(registered)} of {self.num_proc} Spark tasks started within the start timeout "
                    f"({self._start_timeout:g} s, start_timeout= or HOROVOD_SPARK_START_TIMEOUT): barrier mode "
                    f"starts all tasks together, so the cluster needs {self.num_proc} free task slots at once; "
                    "lower num_proc or add executors/cores")
            time.sleep(0.1)


def spark_message(error: BaseException | None) -> str:
    """What a Spark error says, without the Java stack a Py4J error carries."""
    if error is None:
        return "it ended without an error"
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "Exception: " in line:
            return line.split("Exception: ", 1)[1]
    return lines[0] if lines else type(error).__name__
