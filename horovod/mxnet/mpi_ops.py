"""Collectives on MXNet NDArrays: Horovod's public MXNet API.

Every function is a few lines over `horovod.mxnet._bridge` (NDArray <-> host array, submit,
wait). Trailing `_` variants write the result into the input. `priority` is accepted for
compatibility: the engine orders work by negotiation, not by priority.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from horovod.common import ops
from horovod.common.gradients import resolve_op
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average
from horovod.mxnet._bridge import run

__all__ = [
    "allgather", "allreduce", "allreduce_", "alltoall", "barrier", "broadcast", "broadcast_", "grouped_allgather",
    "grouped_allreduce", "grouped_allreduce_", "grouped_reducescatter", "join", "reducescatter",
]


def _allreduce(tensors: Sequence[Any], grouped: bool, inplace: bool, average: bool | None, name: str | None,
               prescale_factor: float, postscale_factor: float, process_set: ProcessSet, op: int | None) -> Any:
    return run("allreduce", tensors, grouped=grouped, inplace=inplace, name=name, op=resolve_op(op, average),
               prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set=process_set)


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set, op: int | None = None) -> Any:
    """Reduced copy of `tensor` (Average by default)."""
    return _allreduce([tensor], False, False, average, name, prescale_factor, postscale_factor, process_set, op)


def allreduce_(tensor: Any, average: bool | None = None, name: str | None = None, priority: int = 0,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set, op: int | None = None) -> Any:
    """Reduce `tensor` in place and return it."""
    return _allreduce([tensor], False, True, average, name, prescale_factor, postscale_factor, process_set, op)


def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                      priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, op: int | None = None) -> list[Any]:
    """Reduced copies of a list of tensors, as one unit that may fuse."""
    return _allreduce(tensors, True, False, average, name, prescale_factor, postscale_factor, process_set, op)


def grouped_allreduce_(tensors: Sequence[Any], average: bool | None = None, name: str | None = None,
                       priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set, op: int | None = None) -> list[Any]:
    """Reduce a list of tensors in place, as one unit, and return them."""
    return _allreduce(tensors, True, True, average, name, prescale_factor, postscale_factor, process_set, op)


def allgather(tensor: Any, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Every member's `tensor` concatenated along dim 0 (which may differ per rank), in rank order."""
    return run("allgather", [tensor], name=name, process_set=process_set)


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, priority: int = 0,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """`allgather` of each tensor of the list, as one unit."""
    return run("allgather", tensors, grouped=True, name=name, process_set=process_set)


def broadcast(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> Any:
    """A copy of global rank `root_rank`'s tensor, on every member."""
    return run("broadcast", [tensor], root_rank=root_rank, name=name, process_set=process_set)


def broadcast_(tensor: Any, root_rank: int, name: str | None = None, priority: int = 0,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrite `tensor` with `root_rank`'s, in place, and return it."""
    return run("broadcast", [tensor], inplace=True, root_rank=root_rank, name=name, process_set=process_set)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, priority: int = 0,
             process_set: ProcessSet = global_process_set) -> Any:
    """Rows scattered to every member: `splits[j]` rows to member j (equal parts when None).
    Returns the rows received, in member order; with `splits`, also the int32 NDArray of rows
    received from each member, as `(rows, received_splits)`."""
    split_array = None if splits is None else np.asarray(splits.asnumpy() if hasattr(splits, "asnumpy") else splits)
    rows, received_splits = run("alltoall", [tensor], splits=split_array, name=name, process_set=process_set)
    return rows if splits is None else (rows, received_splits)


def reducescatter(tensor: Any, op: int = Average, name: str | None = None, priority: int = 0,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """This member's block of dim 0 of the reduction (Average or Sum; the first dim0 % n members
    get one extra row)."""
    return run("reducescatter", [tensor], name=name, op=op, prescale_factor=prescale_factor,
               postscale_factor=postscale_factor, process_set=process_set)


def grouped_reducescatter(tensors: Sequence[Any], op: int = Average, name: str | None = None, priority: int = 0,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """`reducescatter` of each tensor of the list, as one unit."""
    return run("reducescatter", tensors, grouped=True, name=name, op=op, prescale_factor=prescale_factor,
               postscale_factor=postscale_factor, process_set=process_set)


def join() -> int:
    """This rank has no more data: it contributes zeros to allreduces until every rank joined.
    Returns the global rank that joined last."""
    return ops.run_now(ops.join_async)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every member of the set reached this call."""
    ops.run_now(lambda: ops.barrier_async(process_set))
