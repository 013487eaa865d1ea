"""Horovod on numpy arrays: the collectives without any deep-learning framework.

Useful on its own (NumPy, scikit-learn, simulations) and the layer every framework adapter
builds on. Each collective has a blocking form returning the result and an `_async` form
returning a handle for `poll`/`synchronize`.

    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    total = hvd.allreduce(np.ones(3), op=hvd.Sum)   # [size, size, size] on every rank
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.common import *  # noqa: F401,F403  (basics, constants, process sets)
from horovod.common import __all__ as _common_all
from horovod.common import ops
from horovod.common.ops import allgather_object, barrier_async, broadcast_object, join_async, poll, run_now, synchronize
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average


def _contiguous(tensor: np.ndarray) -> np.ndarray:
    """A C-contiguous array (copying only if needed); keeps 0-d arrays 0-d, unlike ascontiguousarray."""
    return np.asarray(tensor, order="C")


def _checked(arrays: Sequence[np.ndarray], kind: str, name: str | None) -> Sequence[np.ndarray]:
    """`arrays`, once each is known to be one the core can move in place (this API's one check)."""
    for array in arrays:
        ops.check_host_array(array, kind, name or "")
    return arrays


# The handle-returning forms: the core's own, behind the check.
def allreduce_async(tensor: np.ndarray, name: str | None = None, op: int = Average, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                    output: np.ndarray | None = None) -> ops.Handle:
    """Start an allreduce of `tensor`; `synchronize(handle)` returns the result (into `output` when given)."""
    _checked([tensor], "allreduce", name)
    return ops.allreduce_async(tensor, name, op, prescale_factor, postscale_factor, process_set, output)


def grouped_allreduce_async(tensors: Sequence[np.ndarray], name: str | None = None, op: int = Average,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> ops.Handle:
    """Start reducing several arrays as one unit (negotiated together, fused where they fit)."""
    return ops.grouped_allreduce_async(_checked(tensors, "grouped_allreduce", name), name, op, prescale_factor,
                                       postscale_factor, process_set)


def allgather_async(tensor: np.ndarray, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> ops.Handle:
    """Start gathering every member's `tensor` along dim 0; `synchronize` returns the result."""
    _checked([tensor], "allgather", name)
    return ops.allgather_async(tensor, name, process_set)


def grouped_allgather_async(tensors: Sequence[np.ndarray], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> ops.Handle:
    """Start an allgather of several arrays as one unit."""
    return ops.grouped_allgather_async(_checked(tensors, "grouped_allgather", name), name, process_set)


def broadcast_async(tensor: np.ndarray, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> ops.Handle:
    """Start sending global rank `root_rank`'s `tensor` to every member."""
    _checked([tensor], "broadcast", name)
    return ops.broadcast_async(tensor, root_rank, name, process_set)


def alltoall_async(tensor: np.ndarray, splits: Sequence[int] | np.ndarray | None = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> ops.Handle:
    """Start an alltoall; `synchronize` returns (received rows, received splits)."""
    _checked([tensor], "alltoall", name)
    return ops.alltoall_async(tensor, splits, name, process_set)


def reducescatter_async(tensor: np.ndarray, name: str | None = None, op: int = Average, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> ops.Handle:
    """Start a reducescatter: each member gets its block of dim 0 of the reduction."""
    _checked([tensor], "reducescatter", name)
    return ops.reducescatter_async(tensor, name, op, prescale_factor, postscale_factor, process_set)


def grouped_reducescatter_async(tensors: Sequence[np.ndarray], name: str | None = None, op: int = Average,
                                prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                                process_set: ProcessSet = global_process_set) -> ops.Handle:
    """Start a reducescatter of several arrays as one unit."""
    return ops.grouped_reducescatter_async(_checked(tensors, "grouped_reducescatter", name), name, op,
                                           prescale_factor, postscale_factor, process_set)


# The blocking forms take anything array-like (copied to a contiguous array only if needed).
def allreduce(tensor: np.ndarray, name: str | None = None, op: int = Average, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduced copy of `tensor` (Average by default; integer averages truncate toward zero)."""
    return run_now(lambda: allreduce_async(_contiguous(tensor), name, op, prescale_factor, postscale_factor,
                                           process_set))


def grouped_allreduce(tensors: Sequence[np.ndarray], name: str | None = None, op: int = Average,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Reduced copies of `tensors`, reduced as one unit (negotiated together, fused where they fit)."""
    return run_now(lambda: grouped_allreduce_async([_contiguous(t) for t in tensors], name, op, prescale_factor,
                                                   postscale_factor, process_set))


def allgather(tensor: np.ndarray, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Every member's `tensor` concatenated along dim 0 (which may differ per rank), in rank order."""
    return run_now(lambda: allgather_async(_contiguous(tensor), name, process_set))


def grouped_allgather(tensors: Sequence[np.ndarray], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """`allgather` of each of `tensors`, as one unit."""
    return run_now(lambda: grouped_allgather_async([_contiguous(t) for t in tensors], name, process_set))


def broadcast(tensor: np.ndarray, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """A copy of global rank `root_rank`'s `tensor`, on every member."""
    return run_now(lambda: broadcast_async(_contiguous(tensor), root_rank, name, process_set))


def alltoall(tensor: np.ndarray, splits: Sequence[int] | np.ndarray | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Rows scattered by `splits`; returns the received rows, plus the received splits when
    `splits` was given (as Horovod does)."""
    output, received = run_now(lambda: alltoall_async(_contiguous(tensor), splits, name, process_set))
    return output if splits is None else (output, received)


def reducescatter(tensor: np.ndarray, name: str | None = None, op: int = Average, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> np.ndarray:
    """This member's block of dim 0 of the reduction of `tensor` over the set."""
    return run_now(lambda: reducescatter_async(_contiguous(tensor), name, op, prescale_factor, postscale_factor,
                                               process_set))


def grouped_reducescatter(tensors: Sequence[np.ndarray], name: str | None = None, op: int = Average,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """`reducescatter` of each of `tensors`, as one unit."""
    return run_now(lambda: grouped_reducescatter_async([_contiguous(t) for t in tensors], name, op, prescale_factor,
                                                       postscale_factor, process_set))


def join(process_set: ProcessSet = global_process_set) -> int:
    """Block until every rank joined; returns the global rank that joined last."""
    return run_now(lambda: join_async(process_set))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every member of `process_set` has called it."""
    run_now(lambda: barrier_async(process_set))


__all__ = [*_common_all,
    "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_async", "alltoall",
    "alltoall_async", "barrier", "broadcast", "broadcast_async", "broadcast_object", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "join", "poll", "reducescatter", "reducescatter_async", "synchronize",
]
