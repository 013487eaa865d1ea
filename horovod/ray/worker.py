"""The Ray actor that hosts one Horovod worker, and what a function running in it may call.

An actor is a long-lived worker process on some node of the Ray cluster. It is created with its
slot's `HOROVOD_*` variables already in its environment (Ray's `runtime_env`), so `hvd.init()`
inside it is exactly `hvd.init()` in a process that horovodrun started: the `env` bootstrap for
`RayExecutor`, the `store` bootstrap for `ElasticRayExecutor`. The actor itself only runs
functions and turns an exception into a `WorkerError` that names the rank, the node and the
traceback; after a failure it leaves Horovod at once so its peers fail fast instead of waiting
for it in a collective.
"""

from __future__ import annotations

import os
import traceback
from types import TracebackType
from typing import Any, Callable, Protocol

from horovod.common import basics
from horovod.common.settings import Settings


class Reporter(Protocol):
    """Where `report` sends rank 0's values: a `ray.util.queue.Queue` in the driver's job."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None: ...


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_reporter: Reporter | None = None
_slot_rank = 0


def report(value: Any) -> None:
    """Hand `value` to the driver's `callbacks=` (and to Ray Tune, under `DistributedTrainableCreator`).

    Only rank 0's values are delivered, as in Horovod; on other ranks, or outside a run that was
    given callbacks, this does nothing.
    """
    deliver(value)


def deliver(value: Any, chief_only: bool = True) -> bool:
    """Send `value` to the driver's callbacks (from rank 0 only, with `chief_only`); False when
    it should go but this worker has nowhere to send it (no callbacks, or outside a run)."""
    rank = basics.rank() if basics.is_initialized() else _slot_rank
    if chief_only and rank != 0:
        return True
    if _reporter is None:
        return False
    _reporter.put(value)
    return True


def use_reporter(reporter: Reporter | None) -> None:
    """Send what this worker reports to `reporter` (`horovod.ray.ray_logger.configure`)."""
    global _reporter
    _reporter = reporter


def node_name() -> str:
    """This node as failures name it: its address and Ray's node id."""
    import ray

    return f"{ray.util.get_node_ip_address()} (Ray node {ray.get_runtime_context().get_node_id()})"


class WorkerError(RuntimeError):
    """A worker's function raised: which rank, on which node, and its traceback.

    `departed` lists the ranks this rank had seen leave or die before it failed: its own error is
    then most likely their consequence (`horovod.runner.report.root_cause`).
    """

    def __init__(self, message: str, rank: int, node: str, departed: tuple[int, ...] = ()) -> None:
        super().__init__(message, rank, node, departed)  # all in args: Ray pickles exceptions by args
        self.rank, self.node, self.departed = rank, node, departed

    def __str__(self) -> str:
        return str(self.args[0])


def run_reporting(rank: int | None, fn: Callable[[], Any], reporter: Reporter | None) -> Any:
    """Run `fn()` as rank `rank` of a job (None: the rank of this worker's environment): `report`
    goes to `reporter`, an exception becomes a `WorkerError`, and Horovod is left at once (telling
    the peers) so that they do not wait for us."""
    global _reporter, _slot_rank
    if rank is None:
        rank = Settings.from_env().topology.rank
    _reporter, _slot_rank = reporter, rank
    try:
        return fn()
    except Exception as exc:
        departed: tuple[int, ...] = ()
        if basics.is_initialized():
            rank = basics.rank()
            departed = tuple(sorted(basics.runtime().engine.departed_peers()))
            basics.abort(exc)
        text = "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__)))
        raise WorkerError(f"rank {rank} on node {node_name()} failed:\n{text}", rank, node_name(),
                          departed) from None
    finally:
        _reporter = None


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the user's function on: our own calling frames say nothing."""
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        tb = tb.tb_next
    return tb


class BaseHorovodWorker:
    """One Horovod worker as a Ray actor (made remote by the executor, with its slot's environment).

    `executable` is the instance of the `executable_cls` given to `RayExecutor.start`, if any:
    `execute(fn)` calls `fn(executable)` on every worker.
    """

    def __init__(self, world_rank: int = 0, world_size: int = 1) -> None:
        self.world_rank, self.world_size = world_rank, world_size
        self.executable: Any = None

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def env(self, name: str) -> str | None:
        """A variable of this worker's environment (what the executor handed it)."""
        return os.environ.get(name)

    def start_executable(self, executable_cls: type | None, args: list[Any], kwargs: dict[str, Any]) -> None:
        if executable_cls is not None:
            self.executable = executable_cls(*args, **kwargs)

    def execute(self, fn: Callable[[Any], Any], reporter: Reporter | None = None) -> Any:
        return run_reporting(self.world_rank, lambda: fn(self.executable), reporter)

    def run_task(self) -> int:
        """An elastic job's worker: `horovod.runner.run_task` in this process (function from the store)."""
        from horovod.runner import run_task

        return run_task.main()
