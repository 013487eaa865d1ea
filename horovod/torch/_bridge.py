"""torch tensors <-> the buffers the core moves: the one path every torch collective takes.

* `buffer` validates a tensor once and gives the core its memory without a copy: a CPU tensor
  as the numpy array over its memory (bfloat16 as an `ml_dtypes.bfloat16` view of the same
  bytes), a CUDA tensor as a `DeviceBuffer` (its `data_ptr`, and the current stream, where it is
  ready and where its result will be). The core runs device collectives on NCCL, or stages them
  through host memory itself. Outputs whose size only negotiation tells are allocated by torch's
  caching allocator on the caller's stream.
* `start` submits the buffers to `horovod.common.ops` and returns a `Pending` whose `wait()` turns
  the core's result back into tensors (again without copying). In-place variants let the core
  write the result straight into the tensor's memory. `run` submits and waits, with this thread
  running the engine meanwhile. A CUDA result is ready on the caller's stream when `wait()`
  returns: the stream waits for the collective's event; the host does not.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.autograd.graph import increment_version

from horovod.common import ops
from horovod.common.collective_rules import CORE_CALLS
from horovod.common.device.buffers import Buffer, DeviceBuffer
from horovod.common.process_sets import ProcessSet
from horovod.common.reduce_ops import BFLOAT16, DTYPE_NAMES, is_bfloat16

SUPPORTED_DTYPES = tuple(getattr(torch, name) for name in DTYPE_NAMES)
_SUPPORTED = frozenset(SUPPORTED_DTYPES)  # every op asks: a set lookup, not a scan of the tuple
_NAME_OF = {getattr(torch, name): name for name in DTYPE_NAMES}
# Views of small named CPU tensors kept for their next op (see `_named_buffer`): only small ones,
# where the view's cost shows, and a bounded number, since each keeps its tensor alive.
_VIEWS: dict[tuple[str, str], tuple[torch.Tensor, int, torch.dtype, np.ndarray]] = {}
_VIEW_BYTES = 16 << 10
_VIEWS_KEPT = 1024


def _what(op: str, name: str | None) -> str:
    """How an error names the call (built only on error: every op passes through here)."""
    return f"{op} {name}" if name else op


def checked(tensor: torch.Tensor, op: str, name: str | None) -> torch.Tensor:
    """`tensor`, once it is known that the core can move it (else ValueError, saying why)."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{_what(op, name)}: expected a torch.Tensor, got {type(tensor).__name__}")
    dtype = tensor.dtype  # each read builds the answer again: once per op
    if dtype not in _SUPPORTED or (dtype is torch.bfloat16 and BFLOAT16 is None):
        hint = " (bfloat16 needs the ml_dtypes package)" if dtype is torch.bfloat16 else ""
        raise ValueError(f"{_what(op, name)}: tensor type {dtype} is not supported{hint}; supported types: "
                         f"{', '.join(str(d).replace('torch.', '') for d in SUPPORTED_DTYPES)}")
    if tensor.layout is not torch.strided:
        raise ValueError(f"{_what(op, name)}: {tensor.layout} tensors are not supported here; use "
                         "sparse_allreduce_async for sparse tensors")
    if not tensor.is_contiguous():
        raise ValueError(f"{_what(op, name)}: the tensor is not contiguous; pass tensor.contiguous()")
    return tensor


def buffer(tensor: torch.Tensor) -> Buffer:
    """The core's view of a checked tensor's memory: a numpy array on CPU, a DeviceBuffer on CUDA."""
    if tensor.is_cpu:  # `is_cpu`, not `device.type`: a sixth of the cost, on every op
        return host_array(tensor)
    if tensor.is_cuda:
        return device_buffer(tensor, torch.cuda.current_stream(tensor.device))
    return host_array(tensor.cpu())  # another accelerator: through host memory


def _named_buffer(tensor: torch.Tensor, kind: str, name: str) -> Buffer:
    """`buffer(checked(tensor))` for a named op. A small CPU tensor that comes back under its name
    (a loop reducing the same tensor each step) gets the view it had: `numpy()` costs more than
    the look that shows nothing changed (the same tensor, memory, dtype, shape, contiguous)."""
    seen = _VIEWS.get((kind, name))
    if (seen is not None and seen[0] is tensor and seen[1] == tensor.data_ptr() and seen[2] is tensor.dtype
            and seen[3].shape == tensor.shape and tensor.is_contiguous()):
        return seen[3]
    array = buffer(checked(tensor, kind, name))
    if tensor.is_cpu and array.nbytes <= _VIEW_BYTES:  # elsewhere the array is a copy: never kept
        if len(_VIEWS) >= _VIEWS_KEPT:
            _VIEWS.clear()
        _VIEWS[kind, name] = (tensor, tensor.data_ptr(), tensor.dtype, array)
    return array


def device_buffer(tensor: torch.Tensor, stream: torch.cuda.Stream) -> DeviceBuffer:
    """A CUDA tensor as the core sees it; `stream` is where it is ready and its result is awaited."""

    def allocate(shape: tuple[int, ...]) -> DeviceBuffer:
        with torch.cuda.stream(stream):  # the block belongs to the stream that will use it
            out = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
        return device_buffer(out, stream)

    return DeviceBuffer(tensor.data_ptr(), tuple(tensor.shape), _NAME_OF[tensor.dtype], tensor.element_size(),
                        tensor.device.index, stream.cuda_stream, tensor, allocate)


def host_array(tensor: torch.Tensor) -> np.ndarray:
    """The numpy array over a CPU tensor's memory (what the core moves)."""
    if tensor.requires_grad:  # numpy() refuses such a tensor; detach() costs 0.3 us, so only then
        tensor = tensor.detach()
    if tensor.dtype is torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BFLOAT16)
    return tensor.numpy()


def to_tensor(array: Buffer, device: torch.device) -> torch.Tensor:
    """A tensor on `device` holding the core's result (sharing its memory where it is there)."""
    if isinstance(array, DeviceBuffer):
        return array.owner
    if is_bfloat16(array.dtype):
        tensor = torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)


class Pending:
    """A submitted collective; `wait()` returns its result as tensors."""

    __slots__ = ("handle", "finish")

    def __init__(self, handle: ops.Handle, finish: Callable[[Any], Any]) -> None:
        self.handle = handle
        self.finish = finish

    def poll(self) -> bool:
        return self.handle.poll()

    def wait(self) -> Any:
        return self.finish(ops.wait_as_internal_error(self.handle))


def start(kind: str, tensors: Sequence[torch.Tensor], grouped: bool = False, inplace: bool = False,
          **kwargs: Any) -> Pending:
    """Submit `tensors` to the core's collective `kind`; the one path every collective here takes."""
    return _pending(kind, tensors, grouped, inplace, kwargs)


def run(kind: str, tensors: Sequence[torch.Tensor], grouped: bool = False, inplace: bool = False,
        **kwargs: Any) -> Any:
    """Submit and wait: this thread runs the engine itself (see `ops.run_now`)."""
    return ops.run_now(_pending, kind, tensors, grouped, inplace, kwargs)


def _pending(kind: str, tensors: Sequence[torch.Tensor], grouped: bool, inplace: bool,
             kwargs: dict[str, Any]) -> Pending:
    return Pending(*_submit(kind, tensors, grouped, inplace, kwargs))


def _submit(kind: str, tensors: Sequence[torch.Tensor], grouped: bool, inplace: bool,
            kwargs: dict[str, Any]) -> tuple[ops.Handle, Callable[[Any], Any]]:
    """Check and submit `tensors`; returns the handle, and what turns its result into tensors."""
    name = kwargs.get("name")
    if grouped or not name:
        arrays = [buffer(checked(t, kind, name)) for t in tensors]
    else:
        arrays = [_named_buffer(tensors[0], kind, name)]
    if inplace:
        kwargs["outputs" if grouped else "output"] = arrays if grouped else arrays[0]
    single, group = CORE_CALLS[kind]
    handle = group(arrays, **kwargs) if grouped else single(arrays[0], **kwargs)  # type: ignore[misc]

    def finish(result: Any) -> Any:
        if inplace:
            for tensor, array in zip(tensors, arrays):
                if not tensor.is_cpu and not tensor.is_cuda:  # another accelerator: the core wrote a host copy
                    tensor.detach().copy_(to_tensor(array, torch.device("cpu")))
                increment_version(tensor)
            return list(tensors) if grouped else tensors[0]
        results = result if grouped else [result]
        if kind == "alltoall":
            outputs: list[Any] = [(to_tensor(r[0], t.device), torch.from_numpy(r[1]))
                                  for r, t in zip(results, tensors)]
        else:
            outputs = [to_tensor(r, t.device) for r, t in zip(results, tensors)]
        return outputs if grouped else outputs[0]

    return handle, finish


def members(process_set: ProcessSet) -> list[int]:
    """The set's global ranks (the set must be registered)."""
    process_set.require_registered()
    return process_set.ranks
