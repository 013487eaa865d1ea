"""Collectives on torch tensors: Horovod's public torch API.

Every public function here is a few lines over one generic path in `horovod.torch._bridge`
(tensor <-> host array, submit, wait). Blocking variants run the engine on the calling thread;
in-place variants (trailing `_`) let the core write straight into the tensor's memory.
The differentiable (out-of-place, blocking) variants apply Horovod's autograd nodes
(`HorovodAllreduce`, ..., in `horovod.torch.collective_nodes`, re-exported here as Horovod has them).

Async variants return integer handles, as Horovod's do, for `poll` and `synchronize`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import torch

from horovod.common import *  # noqa: F401,F403  Horovod's mpi_ops re-exports the basics: scripts import them here
from horovod.common import __all__ as _common_all
from horovod.common import basics, collective_rules, ops
from horovod.common.gradients import resolve_op
from horovod.common.util import check_extension, gpu_available, num_rank_is_power_2, split_list  # noqa: F401
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum
from horovod.torch._bridge import Pending, members, run, start
from horovod.torch.collective_nodes import (HorovodAllgather, HorovodAllreduce, HorovodAlltoall, HorovodBroadcast,
                                            HorovodGroupedAllgather, HorovodGroupedAllreduce,
                                            HorovodGroupedReducescatter, HorovodReducescatter, compressed, splits_list)
from horovod.torch.compression import Compression, Compressor

__all__ = sorted({
    "HorovodAllgather", "HorovodAllreduce", "HorovodAlltoall", "HorovodBroadcast", "HorovodGroupedAllgather",
    "HorovodGroupedAllreduce", "HorovodGroupedReducescatter", "HorovodReducescatter",
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allgather_async", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "init", "join", "poll", "reducescatter",
    "reducescatter_async", "sparse_allreduce_async", "synchronize",
    "check_extension", "check_num_rank_power_of_2", "gpu_available", "handle_average_backwards_compatibility",
    "split_list", *_common_all,
})

# Horovod's names for two helpers: `(op, average) -> op` and "is the rank count a power of 2".
handle_average_backwards_compatibility = resolve_op
check_num_rank_power_of_2 = num_rank_is_power_2


# -- integer handles ----------------------------------------------------------------------------------
_handle_map: dict[int, Pending] = {}
_handle_ids = itertools.count(1)


def _register(pending: Pending) -> int:
    handle = next(_handle_ids)
    _handle_map[handle] = pending
    return handle


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Join the job (see `horovod.common.basics.init`); forgets handles of any earlier run."""
    _handle_map.clear()
    basics.init(comm, process_sets)


def poll(handle: int) -> bool:
    """True once the collective behind `handle` finished; never blocks."""
    pending = _handle_map.get(handle)
    if pending is None:
        raise ValueError(f"handle {handle} was never returned by an async collective, or was already "
                         "synchronized")
    return pending.poll()


def synchronize(handle: int) -> Any:
    """Wait for `handle`'s collective and return its output (a list for grouped ops, a tuple
    (output, received_splits) for alltoall); None for an unknown handle.

    A failure on any rank raises `HorovodInternalError` here."""
    pending = _handle_map.pop(handle, None)
    return None if pending is None else pending.wait()


# -- allreduce ------------------------------------------------------------------------------------------
def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` across the set into a new tensor; returns a handle."""
    return _register(start("allreduce", [tensor], name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` in place; returns a handle."""
    return _register(start("allreduce", [tensor], inplace=True, name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduced copy of `tensor` (Average by default). Differentiable: the gradient is the same
    allreduce of the output's gradient."""
    return compressed(compression, lambda t: (HorovodAllreduce.apply(t, average, name, op, prescale_factor,
                                                                       postscale_factor, process_set),), [tensor])[0]


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce `tensor` in place and return it."""
    return run("allreduce", [tensor], inplace=True, name=name, op=resolve_op(op, average),
                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  process_set=process_set)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors as one unit; `synchronize` returns the list of results."""
    return _register(start("allreduce", tensors, grouped=True, name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors in place, as one unit."""
    return _register(start("allreduce", tensors, grouped=True, inplace=True, name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduced copies of a list of tensors (differentiable, like `allreduce`)."""
    return compressed(compression, lambda *ts: HorovodGroupedAllreduce.apply(
        average, name, op, prescale_factor, postscale_factor, process_set, *ts), tensors)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce a list of tensors in place, as one unit, and return them."""
    return run("allreduce", tensors, grouped=True, inplace=True, name=name, op=resolve_op(op, average),
                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  process_set=process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: ProcessSet = global_process_set) -> Callable[[], torch.Tensor]:
    """Reduce a sparse COO tensor by gathering every rank's indices and values.

    Returns a callable (not an integer handle) that waits and returns the reduced sparse tensor
    (uncoalesced: duplicate indices add up when it is used). Only Average and Sum."""
    if op not in collective_rules.SPARSE_OPS:
        raise ValueError(f"sparse_allreduce_async {name}: only op=Average or op=Sum can reduce sparse tensors")
    sparse = tensor.coalesce() if not tensor.is_coalesced() else tensor
    # Gathering concatenates dim 0, so indices travel transposed: one row per non-zero.
    indices = start("allgather", [sparse.indices().t().contiguous()], name=f"{name}.indices",
                     process_set=process_set)
    values = start("allgather", [sparse.values().contiguous()], name=f"{name}.values", process_set=process_set)

    def wait() -> torch.Tensor:
        all_values = values.wait()
        if op == Average:
            all_values = all_values / len(members(process_set))
        return torch.sparse_coo_tensor(indices.wait().t(), all_values, sparse.shape, check_invariants=False)

    return wait


# -- allgather -------------------------------------------------------------------------------------------
def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every member's `tensor` along dim 0 (which may differ per rank)."""
    return _register(start("allgather", [tensor], name=name, process_set=process_set))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather of a list of tensors as one unit."""
    return _register(start("allgather", tensors, grouped=True, name=name, process_set=process_set))


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every member's `tensor` concatenated along dim 0, in rank order. Differentiable: the
    gradient is the Average-allreduce of the output's gradient, narrowed to this rank's rows."""
    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """`allgather` of each tensor of the list, as one unit (differentiable)."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# -- broadcast ------------------------------------------------------------------------------------------
def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start sending the global rank `root_rank`'s tensor to every member, into a new tensor."""
    return _register(start("broadcast", [tensor], root_rank=root_rank, name=name, process_set=process_set))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start overwriting `tensor` with the root's, in place."""
    return _register(start("broadcast", [tensor], inplace=True, root_rank=root_rank, name=name,
                            process_set=process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """The root's tensor, on every member. Differentiable: the root receives the average of all
    members' output gradients, the others zero."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite `tensor` with global rank `root_rank`'s, in place, and return it."""
    return run("broadcast", [tensor], inplace=True, root_rank=root_rank, name=name,
                  process_set=process_set)


# -- alltoall ---------------------------------------------------------------------------------------------
def alltoall_async(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start scattering rows: `splits[j]` rows go to member j (equal parts when None).
    `synchronize` returns (received rows, received splits)."""
    return _register(start("alltoall", [tensor], splits=splits_list(splits), name=name, process_set=process_set))


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Rows scattered to every member. Returns the received rows, plus (when `splits` is given)
    the int32 tensor of rows received from each member. Differentiable: the gradient travels
    back with the received splits."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# -- reducescatter ----------------------------------------------------------------------------------------
def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start reducing across the set, keeping this member's block of dim 0."""
    return _register(start("reducescatter", [tensor], name=name, op=op, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, process_set=process_set))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: int = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of a list of tensors as one unit."""
    return _register(start("reducescatter", tensors, grouped=True, name=name, op=op,
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: int = Average, process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """This member's block of the reduction (Average or Sum; the first dim0 % n members get one
    extra row). Differentiable: the gradient is the allgather of the output's gradient (times
    the set size for Sum)."""
    return compressed(compression, lambda t: (HorovodReducescatter.apply(t, name, op, process_set, prescale_factor,
                                                                           postscale_factor),), [tensor])[0]


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """`reducescatter` of each tensor of the list, as one unit (differentiable)."""
    return compressed(compression, lambda *ts: HorovodGroupedReducescatter.apply(
        name, op, process_set, prescale_factor, postscale_factor, *ts), tensors)


# -- control --------------------------------------------------------------------------------------------
def join(device: int = -1) -> int:
    """Announce this rank has no more batches and wait for every rank to do the same; until then
    it contributes zeros to the others' allreduces. Returns the global rank that joined last.

    `device` is accepted for compatibility (there is no GPU transport to pick yet)."""
    return ops.run_now(ops.join_async)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every member of the set reached this call."""
    ops.run_now(lambda: ops.barrier_async(process_set))
