"""Collectives on torch tensors.

Every public function here is a few lines over one generic path:

* `_host` turns a tensor into the numpy array the core moves. A CPU tensor is *not copied*: the
  array shares its memory (bfloat16 travels as an `ml_dtypes.bfloat16` view of the same bytes).
  A CUDA tensor is staged through a host copy until a GPU transport exists.
* `_start` submits the arrays to `horovod.common.ops` and returns a `_Pending` whose `wait()`
  turns the core's result back into tensors (again without copying on CPU). In-place variants
  (trailing `_`) let the core write the result straight into the tensor's memory. Blocking
  variants use `_run`: submit and wait, with this thread running the engine meanwhile.
* `_Collective` is the single autograd node of the differentiable (out-of-place, blocking)
  variants; each op supplies its gradient rule as a closure.

Async variants return integer handles, as Horovod's do, for `poll` and `synchronize`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import numpy as np
import torch

from horovod.common import basics, ops
from horovod.common.exceptions import HorovodInternalError
from horovod.common.gradients import resolve_op
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import BFLOAT16, Adasum, Average, Max, Min, Product, Sum
from horovod.torch.compression import Compression, Compressor

__all__ = [
    "Adasum", "Average", "Max", "Min", "Product", "Sum", "allgather", "allgather_async", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "init", "join", "poll", "reducescatter",
    "reducescatter_async", "sparse_allreduce_async", "synchronize",
]

_SUPPORTED = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.bool)


# -- tensors <-> host arrays ------------------------------------------------------------------------
def _host(tensor: torch.Tensor, op: str, name: str | None) -> np.ndarray:
    """The numpy array the core reads: the tensor's own memory on CPU, a host copy otherwise."""
    what = f"{op} {name}" if name else op
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in _SUPPORTED or (tensor.dtype is torch.bfloat16 and BFLOAT16 is None):
        hint = " (bfloat16 needs the ml_dtypes package)" if tensor.dtype is torch.bfloat16 else ""
        raise ValueError(f"{what}: tensor type {tensor.dtype} is not supported{hint}; supported types: "
                         f"{', '.join(str(d).replace('torch.', '') for d in _SUPPORTED)}")
    if tensor.layout is not torch.strided:
        raise ValueError(f"{what}: {tensor.layout} tensors are not supported here; use sparse_allreduce_async "
                         "for sparse tensors")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: the tensor is not contiguous; pass tensor.contiguous()")
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype is torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BFLOAT16)
    return tensor.numpy()


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A tensor on `device` holding `array` (sharing its memory when the device is the CPU)."""
    if array.dtype == BFLOAT16:
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)


class _Pending:
    """A submitted collective; `wait()` returns its result as tensors."""

    __slots__ = ("handle", "finish")

    def __init__(self, handle: ops.Handle, finish: Callable[[Any], Any]) -> None:
        self.handle = handle
        self.finish = finish

    def poll(self) -> bool:
        return self.handle.poll()

    def wait(self) -> Any:
        try:
            result = self.handle.wait()
        except HorovodInternalError:
            raise
        except RuntimeError as exc:
            raise HorovodInternalError(str(exc)) from exc
        return self.finish(result)


_CORE = {  # op -> (single-tensor core call, list core call)
    "allreduce": (ops.allreduce_async, ops.grouped_allreduce_async),
    "allgather": (ops.allgather_async, ops.grouped_allgather_async),
    "broadcast": (ops.broadcast_async, None),
    "alltoall": (ops.alltoall_async, None),
    "reducescatter": (ops.reducescatter_async, ops.grouped_reducescatter_async),
}


def _start(kind: str, tensors: Sequence[torch.Tensor], grouped: bool = False, inplace: bool = False,
           **kwargs: Any) -> _Pending:
    """Submit `tensors` to the core's collective `kind`; the one path every collective here takes."""
    arrays = [_host(t, kind, kwargs.get("name")) for t in tensors]
    if inplace:
        kwargs["outputs" if grouped else "output"] = arrays if grouped else arrays[0]
    single, group = _CORE[kind]
    handle = group(arrays, **kwargs) if grouped else single(arrays[0], **kwargs)
    devices = [t.device for t in tensors]

    def finish(result: Any) -> Any:
        results = result if grouped else [result]
        if inplace:
            for tensor, array in zip(tensors, results):
                if tensor.device.type != "cpu":  # staged: copy the host result back to the device
                    tensor.copy_(_tensor(array, tensor.device))
                torch.autograd.graph.increment_version(tensor)
            outputs: list[Any] = list(tensors)
        elif kind == "alltoall":
            outputs = [(_tensor(r[0], d), torch.from_numpy(r[1])) for r, d in zip(results, devices)]
        else:
            outputs = [_tensor(r, d) for r, d in zip(results, devices)]
        return outputs if grouped else outputs[0]

    return _Pending(handle, finish)


def _run(kind: str, tensors: Sequence[torch.Tensor], **kwargs: Any) -> Any:
    """Submit and wait: this thread runs the engine itself (see Engine.caller_waits)."""
    with basics.runtime().engine.caller_waits():
        pending = _start(kind, tensors, **kwargs)
    return pending.wait()


# -- integer handles ----------------------------------------------------------------------------------
_handle_map: dict[int, _Pending] = {}
_handle_ids = itertools.count(1)


def _register(pending: _Pending) -> int:
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


# -- helpers -------------------------------------------------------------------------------------------------
def _members(process_set: ProcessSet) -> list[int]:
    process_set._require_registered()
    return process_set.ranks


# -- autograd ---------------------------------------------------------------------------------------------
class _Collective(torch.autograd.Function):
    """The autograd node of every differentiable collective.

    `run(*tensors)` returns a tuple of outputs; `grad(*output_grads)` returns a tuple of input
    gradients. Integer outputs (alltoall's received splits) are non-differentiable by dtype."""

    @staticmethod
    def forward(ctx: Any, run: Callable[..., tuple], grad: Callable[..., tuple], *tensors: torch.Tensor) -> Any:
        ctx.grad_rule = grad
        return run(*tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        return (None, None, *ctx.grad_rule(*(g.contiguous() for g in grads)))


def _differentiable(kind: str, tensors: Sequence[torch.Tensor], grad: Callable[..., tuple], grouped: bool,
                    compression: type[Compressor] = Compression.none, **kwargs: Any) -> list[torch.Tensor]:
    """The out-of-place, blocking form of collective `kind`, as an autograd node whose input
    gradients are `grad(*output_grads)`. Tensors travel through `compression`."""
    compressed = [compression.compress(t) for t in tensors]

    def run(*ts: torch.Tensor) -> tuple:
        result = _run(kind, ts, grouped=grouped, **kwargs)
        return tuple(result) if grouped else (result,)

    outputs = _Collective.apply(run, grad, *(c for c, _ in compressed))
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(outputs, compressed)]


def _own_rows(grads: Sequence[torch.Tensor], inputs_dim0: Sequence[int], process_set: ProcessSet) -> tuple:
    """Gradient of an allgather: average the output gradients, keep this rank's rows."""
    reduced = _allreduce(grads, None, Compression.none, Average, 1.0, 1.0, process_set, grouped=True)
    dims = allgather(torch.tensor([list(inputs_dim0)], dtype=torch.int64), process_set=process_set)
    me = _members(process_set).index(basics.rank())
    offsets = dims[:me].sum(dim=0).tolist()
    return tuple(r.narrow(0, int(o), int(d)) for r, o, d in zip(reduced, offsets, inputs_dim0))


# -- allreduce ------------------------------------------------------------------------------------------
def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
                    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` across the set into a new tensor; returns a handle."""
    return _register(_start("allreduce", [tensor], name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start reducing `tensor` in place; returns a handle."""
    return _register(_start("allreduce", [tensor], inplace=True, name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduced copy of `tensor` (Average by default). Differentiable: the gradient is the same
    allreduce of the output's gradient."""
    return _allreduce([tensor], name, compression, resolve_op(op, average), prescale_factor, postscale_factor,
                      process_set, grouped=False)[0]


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce `tensor` in place and return it."""
    return _run("allreduce", [tensor], inplace=True, name=name, op=resolve_op(op, average),
                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  process_set=process_set)


def grouped_allreduce_async(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                            op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start reducing a list of tensors as one unit; `synchronize` returns the list of results."""
    return _register(_start("allreduce", tensors, grouped=True, name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                             op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    return _register(_start("allreduce", tensors, grouped=True, inplace=True, name=name, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def grouped_allreduce(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduced copies of a list of tensors (differentiable, like `allreduce`)."""
    return _allreduce(tensors, name, compression, resolve_op(op, average), prescale_factor, postscale_factor,
                      process_set, grouped=True)


def grouped_allreduce_(tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
                       op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return _run("allreduce", tensors, grouped=True, inplace=True, name=name, op=resolve_op(op, average),
                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                  process_set=process_set)


def _allreduce(tensors: Sequence[torch.Tensor], name: str | None, compression: type[Compressor], op: int,
               prescale: float, postscale: float, process_set: ProcessSet, grouped: bool) -> list[torch.Tensor]:
    def grad(*gs: torch.Tensor) -> tuple:
        return tuple(_allreduce(gs, None, Compression.none, op, prescale, postscale, process_set, grouped))

    return _differentiable("allreduce", tensors, grad, grouped, compression, name=name, op=op,
                           prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: int,
                           process_set: ProcessSet = global_process_set) -> Callable[[], torch.Tensor]:
    """Reduce a sparse COO tensor by gathering every rank's indices and values.

    Returns a callable (not an integer handle) that waits and returns the reduced sparse tensor
    (uncoalesced: duplicate indices add up when it is used). Only Average and Sum."""
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async {name}: only op=Average or op=Sum can reduce sparse tensors")
    sparse = tensor.coalesce() if not tensor.is_coalesced() else tensor
    # Gathering concatenates dim 0, so indices travel transposed: one row per non-zero.
    indices = _start("allgather", [sparse.indices().t().contiguous()], name=f"{name}.indices",
                     process_set=process_set)
    values = _start("allgather", [sparse.values().contiguous()], name=f"{name}.values", process_set=process_set)

    def wait() -> torch.Tensor:
        all_values = values.wait()
        if op == Average:
            all_values = all_values / len(_members(process_set))
        return torch.sparse_coo_tensor(indices.wait().t(), all_values, sparse.shape, check_invariants=False)

    return wait


# -- allgather -------------------------------------------------------------------------------------------
def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set) -> int:
    """Start concatenating every member's `tensor` along dim 0 (which may differ per rank)."""
    return _register(_start("allgather", [tensor], name=name, process_set=process_set))


def grouped_allgather_async(tensors: Sequence[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    return _register(_start("allgather", tensors, grouped=True, name=name, process_set=process_set))


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every member's `tensor` concatenated along dim 0, in rank order. Differentiable: the
    gradient is the Average-allreduce of the output's gradient, narrowed to this rank's rows."""
    return _allgather(tensors=[tensor], name=name, process_set=process_set, grouped=False)[0]


def grouped_allgather(tensors: Sequence[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return _allgather(tensors, name, process_set, grouped=True)


def _allgather(tensors: Sequence[torch.Tensor], name: str | None, process_set: ProcessSet,
               grouped: bool) -> list[torch.Tensor]:
    dim0 = [t.shape[0] if t.dim() else 1 for t in tensors]
    return _differentiable("allgather", tensors, lambda *gs: _own_rows(gs, dim0, process_set), grouped,
                           name=name, process_set=process_set)


# -- broadcast ------------------------------------------------------------------------------------------
def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start sending the global rank `root_rank`'s tensor to every member, into a new tensor."""
    return _register(_start("broadcast", [tensor], root_rank=root_rank, name=name, process_set=process_set))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start overwriting `tensor` with the root's, in place."""
    return _register(_start("broadcast", [tensor], inplace=True, root_rank=root_rank, name=name,
                            process_set=process_set))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """The root's tensor, on every member. Differentiable: the root receives the average of all
    members' output gradients, the others zero."""

    def grad(g: torch.Tensor) -> tuple:
        reduced = _allreduce([g], None, Compression.none, Average, 1.0, 1.0, process_set, grouped=False)[0]
        return (reduced if basics.rank() == root_rank else torch.zeros_like(reduced),)

    return _differentiable("broadcast", [tensor], grad, False, root_rank=root_rank, name=name,
                           process_set=process_set)[0]


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    return _run("broadcast", [tensor], inplace=True, root_rank=root_rank, name=name,
                  process_set=process_set)


# -- alltoall ---------------------------------------------------------------------------------------------
def _splits_list(splits: Sequence[int] | torch.Tensor | None) -> list[int] | None:
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point():
            raise ValueError(f"alltoall: splits must hold integers, got a {splits.dtype} tensor")
        return [int(s) for s in splits.reshape(-1).tolist()]
    return None if splits is None else list(splits)


def alltoall_async(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start scattering rows: `splits[j]` rows go to member j (equal parts when None).
    `synchronize` returns (received rows, received splits)."""
    return _register(_start("alltoall", [tensor], splits=_splits_list(splits), name=name, process_set=process_set))


def alltoall(tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Rows scattered to every member. Returns the received rows, plus (when `splits` is given)
    the int32 tensor of rows received from each member. Differentiable: the gradient travels
    back with the received splits."""
    split_list = _splits_list(splits)

    received: list[torch.Tensor] = []

    def run(t: torch.Tensor) -> tuple:
        output, from_each = _run("alltoall", [t], splits=split_list, name=name, process_set=process_set)
        received.append(from_each)
        return output, from_each

    def grad(g: torch.Tensor, _: torch.Tensor) -> tuple:
        return (alltoall(g, splits=received[0], process_set=process_set)[0],)

    output, received_splits = _Collective.apply(run, grad, tensor)
    return output if splits is None else (output, received_splits)


# -- reducescatter ----------------------------------------------------------------------------------------
def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: int = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start reducing across the set, keeping this member's block of dim 0."""
    return _register(_start("reducescatter", [tensor], name=name, op=op, prescale_factor=prescale_factor,
                            postscale_factor=postscale_factor, process_set=process_set))


def grouped_reducescatter_async(tensors: Sequence[torch.Tensor], name: str | None = None, op: int = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    return _register(_start("reducescatter", tensors, grouped=True, name=name, op=op,
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set))


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: int = Average, process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """This member's block of the reduction (Average or Sum; the first dim0 % n members get one
    extra row). Differentiable: the gradient is the allgather of the output's gradient (times
    the set size for Sum)."""
    return _reducescatter([tensor], name, compression, op, process_set, prescale_factor, postscale_factor, False)[0]


def grouped_reducescatter(tensors: Sequence[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    return _reducescatter(tensors, name, compression, op, process_set, prescale_factor, postscale_factor, True)


def _reducescatter(tensors: Sequence[torch.Tensor], name: str | None, compression: type[Compressor], op: int,
                   process_set: ProcessSet, prescale: float, postscale: float, grouped: bool) -> list[torch.Tensor]:
    def grad(*gs: torch.Tensor) -> tuple:
        scale = prescale * postscale * (len(_members(process_set)) if op == Sum else 1)
        gathered = _allgather(gs, None, process_set, grouped=True)
        return tuple(g * scale if scale != 1 else g for g in gathered)

    return _differentiable("reducescatter", tensors, grad, grouped, compression, name=name, op=op,
                           prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)


# -- control --------------------------------------------------------------------------------------------
def join(device: int = -1) -> int:
    """Announce this rank has no more batches and wait for every rank to do the same; until then
    it contributes zeros to the others' allreduces. Returns the global rank that joined last.

    `device` is accepted for compatibility (there is no GPU transport to pick yet)."""
    return ops.run_now(ops.join_async)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every member of the set reached this call."""
    ops.run_now(lambda: ops.barrier_async(process_set))
