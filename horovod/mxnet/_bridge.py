"""MXNet NDArrays <-> the numpy arrays the core moves.

An NDArray's memory belongs to MXNet's asynchronous engine, so it is read with `asnumpy()`
(which first waits for the operations still writing it) and written back with `tensor[:] = ...`
(queued on that engine like any other write). `start` submits and returns a `Pending`;
`run` submits and waits with this thread running the engine.
"""

from __future__ import annotations

from typing import Any, Sequence

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from horovod.common import ops
from horovod.common.collective_rules import CORE_CALLS
from horovod.common.reduce_ops import dtype_name


def host_array(tensor: Any, what: str) -> np.ndarray:
    """`tensor`'s values as a C-contiguous numpy array; ValueError naming `what` otherwise."""
    if not isinstance(tensor, mx.nd.NDArray):
        raise ValueError(f"{what}: expected an mx.nd.NDArray, got {type(tensor).__name__}")
    if tensor.stype != "default":
        raise ValueError(f"{what}: {tensor.stype} NDArrays are not supported; pass tensor.tostype('default')")
    try:
        dtype_name(np.dtype(tensor.dtype))
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return np.ascontiguousarray(tensor.asnumpy()).reshape(tensor.shape)  # asnumpy() makes a scalar [1]


def to_ndarray(array: np.ndarray, like: Any) -> Any:
    """A new NDArray holding `array`, on `like`'s device."""
    return mx.nd.array(array, ctx=like.context, dtype=array.dtype)


class Pending:
    """A submitted collective; `wait()` returns its result as NDArrays (written into the inputs
    for in-place variants)."""

    __slots__ = ("handle", "kind", "tensors", "grouped", "inplace")

    def __init__(self, handle: ops.Handle, kind: str, tensors: Sequence[Any], grouped: bool, inplace: bool) -> None:
        self.handle, self.kind, self.tensors, self.grouped, self.inplace = handle, kind, list(tensors), grouped, inplace

    def wait(self) -> Any:
        result = ops.wait_as_internal_error(self.handle)
        if self.kind == "alltoall":  # never grouped nor in place: (rows, received splits)
            rows, received_splits = result
            return to_ndarray(rows, self.tensors[0]), to_ndarray(np.asarray(received_splits, np.int32),
                                                                 self.tensors[0])
        results = list(result) if self.grouped else [result]
        outputs = []
        for tensor, array in zip(self.tensors, results):
            if self.inplace:
                tensor[:] = array
                outputs.append(tensor)
            else:
                outputs.append(to_ndarray(array, tensor))
        return outputs if self.grouped else outputs[0]


class ArgumentError(ValueError, MXNetError):
    """A bad argument, found on this rank before anything is sent. A `ValueError`, as in every
    framework module here, and an `MXNetError`, which is what Horovod's MXNet ops raise (their
    checks run inside MXNet's engine): scripts and tests catching either one catch it."""


def start(kind: str, tensors: Sequence[Any], grouped: bool = False, inplace: bool = False, **kwargs: Any) -> Pending:
    """Submit `tensors` to the core's collective `kind` (as one group when `grouped`)."""
    try:
        arrays = [host_array(t, f"{kind} {kwargs.get('name') or ''}".strip()) for t in tensors]
        single, group = CORE_CALLS[kind]
        handle = group(arrays, **kwargs) if grouped else single(arrays[0], **kwargs)  # type: ignore[misc]
    except ValueError as exc:
        raise ArgumentError(str(exc)) from exc
    return Pending(handle, kind, tensors, grouped, inplace)


def run(kind: str, tensors: Sequence[Any], **kwargs: Any) -> Any:
    """Submit and wait: this thread runs the engine itself (see `ops.submit_waited`)."""
    return ops.run_now(start, kind, tensors, **kwargs)
