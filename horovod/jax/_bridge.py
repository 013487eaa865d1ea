"""JAX arrays <-> the buffers the core moves, inside and outside `jax.jit`.

Outside a transformation a JAX array in host memory converts to numpy directly, and one on a GPU
goes to the core as a `DeviceBuffer` over its own memory (the device route: NCCL); the
collective runs now. JAX gives no stream to order work against, so here the host waits: for the
array before it is read, and for the collective before its result, a fresh JAX array the core
wrote, is handed back.
Inside `jit` the values are tracers without data, so the host work runs in a callback whose
outputs have the shapes and dtypes the trace already knows:

* `host_callback` (Keras' jax backend): one `jax.pure_callback` whose outputs keep the inputs'
  shapes, as a reduction does;
* `call` (`horovod.jax`): one *ordered* `io_callback` per collective. Ordered callbacks run in
  program order, so every rank reaches its collectives in the same order however XLA schedules
  the rest of the program, and XLA never drops or merges them as it may a pure callback.

`start` submits eagerly and returns a `Pending` (the `_async` forms).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from horovod.common import ops
from horovod.common.collective_rules import CORE_CALLS
from horovod.common.device.buffers import Buffer, DeviceBuffer
from horovod.common.device.cuda_runtime import runtime as cuda_runtime
from horovod.common.reduce_ops import dtype_name

Host = Callable[[list[Buffer]], list[Any]]


def is_traced(values: Sequence[Any]) -> bool:
    """True inside a jax transformation (jit), where values are tracers without data."""
    return any(isinstance(v, jax.core.Tracer) for v in values if v is not None)


def host_callback(host_fn: Callable[..., Sequence[np.ndarray]], tensors: Sequence[Any]) -> list[Any]:
    """`host_fn(*arrays)` run on the host from traced code; its outputs keep the inputs' shapes
    and dtypes (one output per input, as a reduction has)."""
    shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors]
    return list(jax.pure_callback(host_fn, shapes, *tensors))


def checked(value: Any, what: str) -> jax.Array:
    """`value` as a JAX array of a dtype the core moves; ValueError naming `what` otherwise."""
    array = value if isinstance(value, (jax.Array, jax.core.Tracer)) else jnp.asarray(value)
    try:
        dtype_name(np.dtype(array.dtype))
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    return array


def _numpy(values: Sequence[Any]) -> list[np.ndarray]:
    return [np.asarray(v, order="C") for v in values]


def _on_gpu(value: Any) -> bool:
    return isinstance(value, jax.Array) and value.is_fully_addressable and len(value.devices()) == 1 \
        and next(iter(value.devices())).platform == "gpu" and value.size > 0


def device_buffer(array: jax.Array) -> DeviceBuffer:
    """A single-device GPU array as the core sees it. The host waits for the array first: JAX
    computes on streams of its own that no event of ours can follow."""
    array.block_until_ready()
    device = next(iter(array.devices()))
    dtype = np.dtype(array.dtype)

    def allocate(shape: tuple[int, ...]) -> DeviceBuffer:
        return device_buffer(jnp.zeros(shape, dtype, device=device))

    return DeviceBuffer(array.unsafe_buffer_pointer(), tuple(array.shape), dtype_name(dtype), dtype.itemsize,
                        device.local_hardware_id, 0, array, allocate)


def buffers(values: Sequence[Any]) -> list[Buffer]:
    """The core's buffers for eager values: GPU arrays as device buffers, the rest as numpy."""
    return [device_buffer(v) if _on_gpu(v) else np.asarray(v, order="C") for v in values]


def to_jax(results: Sequence[Any]) -> list[Any]:
    """The core's results as JAX arrays. A device result is the array the core wrote into; the
    host waits until the collective is done (its event is on the legacy stream the buffer named)."""
    if any(isinstance(r, DeviceBuffer) for r in results):
        cuda = cuda_runtime()
        assert cuda is not None
        cuda.synchronize(0)
    return [r.owner if isinstance(r, DeviceBuffer) else jnp.asarray(r) for r in results]


def submit(kind: str, arrays: Sequence[Buffer], grouped: bool, **kwargs: Any) -> ops.Handle:
    """Submit `arrays` to the core's collective `kind` (as one group when `grouped`)."""
    single, group = CORE_CALLS[kind]
    return group(list(arrays), **kwargs) if grouped else single(arrays[0], **kwargs)  # type: ignore[misc]


def flat_results(kind: str, result: Any, grouped: bool) -> list[np.ndarray]:
    """The core's result as a flat list of arrays (alltoall: rows, then received splits)."""
    results = list(result) if grouped else [result]
    return [a for pair in results for a in pair] if kind == "alltoall" else results


def host_collective(kind: str, grouped: bool, **kwargs: Any) -> Host:
    """The host function running collective `kind` on numpy arrays: submit, then wait with this
    thread running the engine (see `ops.submit_waited`)."""

    def run(arrays: list[Buffer]) -> list[Any]:
        return flat_results(kind, ops.run_now(submit, kind, arrays, grouped, **kwargs), grouped)

    return run


def call(host_fn: Host, tensors: Sequence[Any], out_specs: Callable[[], Sequence[jax.ShapeDtypeStruct]]) -> list[Any]:
    """`host_fn` on `tensors`: now on their numpy values, or as one ordered callback in a trace
    (`out_specs()` gives its outputs' shapes and dtypes, asked only then)."""
    if not is_traced(tensors):
        return to_jax(host_fn(buffers(tensors)))
    specs = list(out_specs())

    def on_host(*arrays: Any) -> tuple[np.ndarray, ...]:
        results = host_fn(_numpy(arrays))
        for got, spec in zip(results, specs):
            if got.shape != spec.shape:
                raise ValueError(f"a collective inside jax.jit returned shape {got.shape}, but the trace "
                                 f"assumed {spec.shape}: inside jit, allgather and alltoall need the same "
                                 "dim 0 (and equal splits) on every rank; call them outside jit otherwise")
        return tuple(np.asarray(r, dtype=s.dtype) for r, s in zip(results, specs))

    return list(io_callback(on_host, tuple(specs), *tensors, ordered=True))


class Pending:
    """A collective submitted outside any trace; `wait()` returns its result as JAX arrays."""

    __slots__ = ("handle", "kind", "grouped")

    def __init__(self, handle: ops.Handle, kind: str, grouped: bool) -> None:
        self.handle, self.kind, self.grouped = handle, kind, grouped

    def poll(self) -> bool:
        return self.handle.poll()

    def wait(self) -> Any:
        outputs = to_jax(flat_results(self.kind, self.handle.wait(), self.grouped))
        if self.kind == "alltoall":
            outputs = [tuple(outputs[i:i + 2]) for i in range(0, len(outputs), 2)]
        return outputs if self.grouped else outputs[0]


def start(kind: str, tensors: Sequence[Any], grouped: bool = False, **kwargs: Any) -> Pending:
    """Submit `tensors` now (outside jit only: a trace has no values to send yet)."""
    if is_traced(tensors):
        raise ValueError(f"{kind}_async cannot run inside jax.jit (a traced value has no data yet); "
                         f"use the blocking {kind} there, which runs as an ordered host callback")
    arrays = buffers([checked(t, kind) for t in tensors])
    return Pending(submit(kind, arrays, grouped, **kwargs), kind, grouped)
