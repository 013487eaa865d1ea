"""`horovod.spark.run_elastic`: an elastic Horovod job whose hosts are the live Spark tasks.

It is `horovodrun`'s elastic driver (`horovod.runner.elastic.ElasticDriver`) with two pieces
swapped, as `horovod.ray.elastic` does for Ray nodes: the hosts are the Spark tasks that say they
are alive (`SparkTaskDiscovery`, one slot each), and each worker starts in its task (the
`spark_elastic` launcher). The stage is an ordinary one, not a barrier one, so Spark starts tasks
as slots free up and runs a failed task again: a task that dies (its worker with it, through the
parent-death signal) stops saying it is alive and is a host that left; the task Spark runs in its
place has a new name and is a host that came. A worker that fails inside a live task blacklists
that task, as a failing host is blacklisted in any elastic job.
"""

from __future__ import annotations

import dataclasses
import time
from typing import IO, Any, Callable, Sequence

from horovod.common.rendezvous import RendezvousServer
from horovod.common.settings import Settings
from horovod.runner import deprecated_alias, run_function
from horovod.runner.elastic import ElasticDriver, ElasticSpec
from horovod.runner.elastic.setup import elastic_spec
from horovod.runner.hosts import HostInfo
from horovod.spark import control
from horovod.spark.runner import active_spark_context, control_store, default_start_timeout, job_spec, redirected
from horovod.spark.stage import TaskStage, spark_message
from horovod.spark.task import elastic_task


def _task_order(name: str) -> tuple[int, int]:
    _, partition, attempt = name.split("-")
    return int(partition), int(attempt)


class SparkTaskDiscovery:
    """The elastic tasks whose heartbeat moved within `timeout` seconds, one slot each
    (`horovod.runner.elastic.discovery.HostDiscovery`). A task that falls silent is gone for good:
    the workers it was hosting are reported lost, so the driver does not wait for them."""

    def __init__(self, store: RendezvousServer, timeout: float = control.HEARTBEAT_TIMEOUT_SECONDS) -> None:
        self._store, self._timeout = store, timeout
        self._heard: dict[str, tuple[bytes | None, float]] = {}  # task -> last beat, when it changed
        self._gone: set[str] = set()

    def alive(self) -> list[str]:
        now = time.monotonic()
        for name in self._store.keys(control.ALIVE):
            beat = self._store.get(control.ALIVE, name)
            if name not in self._heard or self._heard[name][0] != beat:
                self._heard[name] = (beat, now)
        for name, (_, heard) in self._heard.items():
            if now - heard > self._timeout and name not in self._gone:
                self._gone.add(name)
                self._report_lost(name)
        return sorted((name for name in self._heard if name not in self._gone), key=_task_order)

    def find_available_hosts(self) -> list[HostInfo]:
        return [HostInfo(name, 1) for name in self.alive()]

    def _report_lost(self, name: str) -> None:
        for key in self._store.keys(control.START):
            if key.startswith(f"{name}.") and self._store.get(control.EXIT, key) is None:
                self._store.put(control.EXIT, key, str(control.LOST_TASK).encode())


class ElasticStage(TaskStage):
    """`run_elastic`'s stage: `num_proc` ordinary tasks, each hosting workers in turn."""

    def _submit(self, rdd: Any) -> None:
        rdd.mapPartitions(elastic_task(self._address, self._start_timeout)).collect()

    def _unreported(self) -> list[str]:
        return [key for key in self._store.keys(control.START) if self._store.get(control.EXIT, key) is None]

    def wait_started(self, discovery: SparkTaskDiscovery, min_num_proc: int) -> int:
        """Wait for all tasks to start, or for the start timeout with at least `min_num_proc`
        started; how many did. A clear error when fewer did, or the stage failed."""
        deadline = time.monotonic() + self._start_timeout
        while True:
            started = len(discovery.alive())
            if started >= self.num_proc:
                return started
            if not self.running:
                raise RuntimeError(f"the Spark stage hosting the {self.num_proc} elastic Horovod tasks ended "
                                   f"before they started: {spark_message(self.error)}")
            if time.monotonic() > deadline:
                if started >= min_num_proc:
                    return started
                raise TimeoutError(
                    f"only {started} of {self.num_proc} Spark tasks started within the start timeout "
                    f"({self._start_timeout:g} s, start_timeout= or HOROVOD_SPARK_START_TIMEOUT) and "
                    f"min_num_proc={min_num_proc} are needed to start: add executors/cores or lower min_num_proc")
            time.sleep(0.1)


@dataclasses.dataclass(frozen=True)
class _Limits:
    num_proc: int
    min_num_proc: int
    max_num_proc: int | None
    elastic_timeout: float
    reset_limit: int | None


def _limits(sc: Any, num_proc: int | None, min_num_proc: int | None, max_num_proc: int | None,
            elastic_timeout: float | None, reset_limit: int | None) -> _Limits:
    """Horovod's defaults (num_proc: Spark's default parallelism; min_num_proc: num_proc), checked."""
    num_proc = sc.defaultParallelism if num_proc is None else num_proc
    min_num_proc = num_proc if min_num_proc is None else min_num_proc
    for name, value in (("num_proc", num_proc), ("min_num_proc", min_num_proc), ("max_num_proc", max_num_proc)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if max_num_proc is not None and min_num_proc > max_num_proc:
        raise ValueError(f"min_num_proc ({min_num_proc}) is larger than max_num_proc ({max_num_proc})")
    if min_num_proc > num_proc:
        raise ValueError(f"min_num_proc ({min_num_proc}) is larger than num_proc ({num_proc}): run_elastic starts "
                         "num_proc Spark tasks, each hosting at most one worker")
    if elastic_timeout is None:
        elastic_timeout = Settings.from_env().elastic_timeout
    if elastic_timeout <= 0:
        raise ValueError(f"elastic_timeout must be positive, got {elastic_timeout}")
    if reset_limit is not None and reset_limit < 0:
        raise ValueError(f"reset_limit must be at least 0, got {reset_limit}")
    return _Limits(num_proc, min_num_proc, max_num_proc, float(elastic_timeout), reset_limit)


def run_elastic(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_proc: int | None = None,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    start_timeout: float | None = None,
    elastic_timeout: float | None = None,
    reset_limit: int | None = None,
    env: dict[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    verbose: int = 1,
    nics: Sequence[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    min_np: int | None = None,
    max_np: int | None = None,
) -> list[Any]:
    """Run the elastic function `fn(*args, **kwargs)` (it uses `hvd.elastic.run`) on `num_proc`
    Spark tasks, going on while at least `min_num_proc` of them are alive; the results of the final
    round's first `min_num_proc` ranks, by rank.

    `num_proc` (default: Spark's default parallelism) tasks are started; `min_num_proc` defaults
    to `num_proc`, `max_num_proc` caps the workers. Below `min_num_proc` the job waits up to
    `elastic_timeout` (default `HOROVOD_ELASTIC_TIMEOUT`, else 600 s); `reset_limit` caps the
    re-formations. `start_timeout`, `env`, `stdout`, `stderr`, `verbose`, `nics` and
    `prefix_output_with_timestamp` are `horovod.spark.run`'s. `min_np` / `max_np` are the
    deprecated spellings of `min_num_proc` / `max_num_proc`.
    """
    min_num_proc = deprecated_alias("min_np", "min_num_proc", min_np, min_num_proc)
    max_num_proc = deprecated_alias("max_np", "max_num_proc", max_np, max_num_proc)
    sc = active_spark_context()
    limits = _limits(sc, num_proc, min_num_proc, max_num_proc, elastic_timeout, reset_limit)
    start_timeout = default_start_timeout(start_timeout)
    with control_store(sc) as (store, address), \
            ElasticStage(sc, limits.num_proc, store, address, start_timeout) as stage, redirected(stdout, stderr):
        discovery = SparkTaskDiscovery(store)
        stage.wait_started(discovery, limits.min_num_proc)
        _, spec = job_spec(f"localhost:{limits.num_proc}", limits.num_proc, start_timeout, verbose, nics,
                           prefix_output_with_timestamp, None, env, "spark_elastic", address.as_options())
        spec = elastic_spec(dataclasses.replace(spec, slots=(), store_address=address.host), limits.elastic_timeout)
        elastic = ElasticSpec(discovery, limits.min_num_proc, limits.max_num_proc, limits.elastic_timeout,
                              limits.reset_limit)
        try:
            with ElasticDriver(spec, elastic) as driver:
                return run_function(driver, fn, args, kwargs)
        finally:
            store.put(control.DONE, "job", b"")
