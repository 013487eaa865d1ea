"""Collectives on TensorFlow tensors, eager and inside `tf.function`.

How one collective runs:

* Eager: the tensors' numpy arrays (no copy on CPU) go to `horovod.common.ops`, the result comes
  back as a new tensor.
* Traced (`tf.function`, Keras `fit`): the same Python body runs in one `tf.py_function` node
  whose outputs carry the static shapes we know. `tf.function` runs stateful nodes (a
  py_function is one) in program order, so every rank reaches its collectives in the same
  order, however many threads the executor has.
* Collectives that belong together (all gradients of a step) are `_Job`s of one node: all are
  submitted before any is waited on, so the engine negotiates them in one round and fuses them.

Gradients come from `tf.custom_gradient`, so no op gradient needs registering.

Names: an unnamed op in eager mode gets the core's `noname.<n>`; in a traced graph it is named
after its input tensor (`HorovodAllreduce_<tensor>`), made unique within the graph, and an
explicit name is prefixed with the current name scope unless `ignore_name_scope`. Every rank
traces the same program, so the names agree.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from horovod.common import basics
from horovod.common import ops as core
from horovod.common.gradients import resolve_op
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average, Sum
from horovod.tensorflow.compression import Compression, Compressor

# Public entry points are not rewritten by AutoGraph when called from a tf.function: they are
# plain Python that builds the graph as it is.
_no_autograph = tf.autograph.experimental.do_not_convert

_SUPPORTED = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
              tf.float64, tf.bool)


# -- running collectives as eager calls or graph nodes ------------------------------------------------
class _Job:
    """One core collective inside a node.

    `start(arrays)` submits it and returns a function that waits and returns the output arrays;
    `dtypes` and `shapes` describe those outputs (shapes may have unknown dims)."""

    __slots__ = ("inputs", "dtypes", "shapes", "start")

    def __init__(self, inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType], shapes: Sequence[Any],
                 start: Callable[[list[np.ndarray]], Callable[[], list[np.ndarray]]]) -> None:
        self.inputs, self.dtypes, self.shapes, self.start = list(inputs), list(dtypes), list(shapes), start


def _host_run(jobs: Sequence[_Job], tensors: Sequence[tf.Tensor]) -> list[np.ndarray]:
    """Submit every job, then wait for every job (eager tensors in, numpy arrays out)."""
    arrays = [np.asarray(t.numpy()) for t in tensors]
    waits, at = [], 0
    for job in jobs:
        waits.append(job.start(arrays[at:at + len(job.inputs)]))
        at += len(job.inputs)
    return [out for wait in waits for out in wait()]


def _run(jobs: Sequence[_Job], label: str = "HorovodCollective") -> list[list[tf.Tensor]]:
    """Run `jobs` together (eagerly, or as one node of the graph being traced); their outputs."""
    flat = [t for job in jobs for t in job.inputs]
    dtypes = [d for job in jobs for d in job.dtypes]
    if tf.executing_eagerly():
        outputs = [tf.convert_to_tensor(r, dtype=d) for r, d in zip(_host_run(jobs, flat), dtypes)]
    else:
        outputs = tf.py_function(lambda *tensors: _host_run(jobs, tensors), flat, Tout=dtypes, name=label)
        for out, shape in zip(outputs, (s for job in jobs for s in job.shapes)):
            out.set_shape(shape)
    grouped, at = [], 0
    for job in jobs:
        grouped.append(list(outputs[at:at + len(job.dtypes)]))
        at += len(job.dtypes)
    return grouped


def _differentiable(forward: Callable[[list[tf.Tensor]], list[tf.Tensor]],
                    backward: Callable[[list[tf.Tensor]], list[tf.Tensor | None]],
                    inputs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """forward(inputs), with backward(output gradients) -> input gradients as its gradient."""

    @tf.custom_gradient
    def node(*xs: tf.Tensor) -> Any:
        ys = forward(list(xs))

        def grad(*dys: tf.Tensor) -> list[tf.Tensor | None]:
            return backward(list(dys))

        return ys, grad

    outputs = node(*inputs)
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


# -- argument handling ---------------------------------------------------------------------------------
def _normalize_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _tensor(value: Any, what: str) -> tf.Tensor:
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype not in _SUPPORTED:
        raise ValueError(f"{what}: tensor type {tensor.dtype.name} is not supported; supported types: "
                         f"{', '.join(d.name for d in _SUPPORTED)}")
    return tensor


def _op_name(default: str, tensors: Sequence[tf.Tensor], name: str | None, ignore_name_scope: bool) -> str | None:
    """The name the core sees (see the module docstring); None means the core's `noname.<n>`."""
    if tf.executing_eagerly():
        return name
    graph = tf.compat.v1.get_default_graph()
    if name is None:
        name = f"{default}_{_normalize_name(tensors[0].name)}"
        if len(tensors) > 1:
            name += f"_{_normalize_name(tensors[-1].name)}"
    elif not ignore_name_scope and graph.get_name_scope():
        name = f"{graph.get_name_scope()}/{name}"
    return graph.unique_name(name)


def _set_size(process_set: ProcessSet) -> int:
    process_set._require_registered()
    return len(process_set.ranks)


def _set_rank(process_set: ProcessSet) -> int:
    rank = process_set.rank()
    if rank is None:
        raise ValueError(f"rank {basics.rank()} is not a member of {process_set}")
    return rank


def _rows_unknown(shape: tf.TensorShape) -> tf.TensorShape:
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else tf.TensorShape(None)


# -- jobs: one per core collective ---------------------------------------------------------------------
_CORE = {  # kind -> (single-tensor call, list call); both take (tensor(s), *args)
    "allreduce": (core.allreduce_async, core.grouped_allreduce_async),
    "allgather": (core.allgather_async, core.grouped_allgather_async),
    "broadcast": (core.broadcast_async, None),
    "reducescatter": (core.reducescatter_async, core.grouped_reducescatter_async),
}


def _core_job(kind: str, tensors: Sequence[tf.Tensor], grouped: bool, *args: Any) -> _Job:
    """A job calling the core's `kind` on `tensors` (as one group when `grouped`) with `args`."""
    single, group = _CORE[kind]

    def start(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
        if grouped:
            return group(arrays, *args).wait
        handle = single(arrays[0], *args)
        return lambda: [handle.wait()]

    same_shape = kind in ("allreduce", "broadcast")
    shapes = [t.shape if same_shape else _rows_unknown(t.shape) for t in tensors]
    return _Job(tensors, [t.dtype for t in tensors], shapes, start)


def _allreduce_job(tensors: Sequence[tf.Tensor], name: str | None, op: int, prescale: float, postscale: float,
                   process_set: ProcessSet, grouped: bool) -> _Job:
    return _core_job("allreduce", tensors, grouped, name, op, prescale, postscale, process_set)


def _allgather_job(tensors: Sequence[tf.Tensor], name: str | None, process_set: ProcessSet, grouped: bool) -> _Job:
    return _core_job("allgather", tensors, grouped, name, process_set)


def _dims0(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    return tf.stack([tf.shape(t, out_type=tf.int64)[0] for t in tensors])[tf.newaxis]


def _own_rows(grads: list[tf.Tensor], inputs: list[tf.Tensor], process_set: ProcessSet, name: str | None) -> list:
    """Gradient of an allgather: the averaged output gradient, cut to this rank's rows."""
    reduced_name = None if name is None else f"{name}.grad"
    sizes_name = None if name is None else f"{name}.grad_sizes"
    jobs = [_allreduce_job(grads, reduced_name, Average, 1.0, 1.0, process_set, grouped=len(grads) > 1),
            _allgather_job([_dims0(inputs)], sizes_name, process_set, grouped=False)]
    reduced, (sizes,) = _run(jobs, "HorovodAllgatherGrad")
    offsets = tf.reduce_sum(sizes[:_set_rank(process_set)], axis=0)
    return [tf.slice(g, tf.concat([offsets[k:k + 1], tf.zeros([g.shape.rank - 1], tf.int64)], 0),
                     tf.shape(x, out_type=tf.int64))
            for k, (g, x) in enumerate(zip(reduced, inputs))]


# -- the collectives -----------------------------------------------------------------------------------
@_no_autograph
def _allreduce(tensor: Any, name: str | None = None, op: int = Sum, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0, ignore_name_scope: bool = False,
               process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Dense allreduce without compression; differentiable (the gradient is reduced the same way)."""
    return _grouped_allreduce([tensor], name, op, prescale_factor, postscale_factor, ignore_name_scope,
                              process_set, grouped=False)[0]


@_no_autograph
def _grouped_allreduce(tensors: Sequence[Any], name: str | None = None, op: int = Sum, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, ignore_name_scope: bool = False,
                       process_set: ProcessSet = global_process_set, grouped: bool = True) -> list[tf.Tensor]:
    inputs = [_tensor(t, "allreduce") for t in tensors]
    if not inputs:
        return []
    kind = "HorovodGroupedAllreduce" if grouped else "HorovodAllreduce"

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        job = _allreduce_job(xs, _op_name(kind, xs, name, ignore_name_scope), op, prescale_factor,
                             postscale_factor, process_set, grouped)
        return _run([job], kind)[0]

    return _differentiable(forward, forward, inputs)


@_no_autograph
def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False) -> Any:
    """Reduce a tensor (or `tf.IndexedSlices`) across the process set; Average by default.

    IndexedSlices are combined by allgathering their values and indices (Average divides the
    values by the set size). `device_dense`/`device_sparse` are accepted for compatibility:
    khorovod's tensors travel through host memory."""
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return _sparse_allreduce(tensor, op, prescale_factor * postscale_factor, name, ignore_name_scope,
                                 process_set)
    compressed, ctx = compression.compress(_tensor(tensor, "allreduce"))
    reduced = _allreduce(compressed, name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set)
    return compression.decompress(reduced, ctx)


def _sparse_op_check(op: int) -> None:
    if op not in (Average, Sum):
        raise NotImplementedError("allreduce of tf.IndexedSlices supports op=Average and op=Sum only; "
                                  "convert the gradient to a dense tensor (sparse_as_dense=True) for other ops")


def _sparse_allreduce(slices: tf.IndexedSlices, op: int, factor: float, name: str | None, ignore_name_scope: bool,
                      process_set: ProcessSet) -> tf.IndexedSlices:
    _sparse_op_check(op)
    values = allgather(slices.values, None if name is None else f"{name}.values", ignore_name_scope, process_set)
    indices = allgather(slices.indices, None if name is None else f"{name}.indices", ignore_name_scope,
                        process_set)
    if op == Average:
        factor /= _set_size(process_set)
    if factor != 1.0:
        values = values * tf.cast(factor, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@_no_autograph
def grouped_allreduce(tensors: Sequence[Any], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: type[Compressor] = Compression.none,
                      op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[Any]:
    """Allreduce a list of tensors as one group (reduced and fused together)."""
    op = resolve_op(op, average)
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        return [allreduce(t, None, device_dense, device_sparse, compression, op, prescale_factor, postscale_factor,
                          None if name is None else f"{name}.{i}", process_set, ignore_name_scope)
                for i, t in enumerate(tensors)]
    pairs = [compression.compress(_tensor(t, "grouped_allreduce")) for t in tensors]
    reduced = _grouped_allreduce([c for c, _ in pairs], name, op, prescale_factor, postscale_factor,
                                 ignore_name_scope, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


@_no_autograph
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every member's tensor along dim 0 (dim 0 may differ between ranks)."""
    return _allgather([tensor], name, ignore_name_scope, process_set, grouped=False)[0]


@_no_autograph
def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    return _allgather(tensors, name, ignore_name_scope, process_set, grouped=True)


def _allgather(tensors: Sequence[Any], name: str | None, ignore_name_scope: bool, process_set: ProcessSet,
               grouped: bool) -> list[tf.Tensor]:
    inputs = [_tensor(t, "allgather") for t in tensors]
    if not inputs:
        return []
    kind = "HorovodGroupedAllgather" if grouped else "HorovodAllgather"
    if any(t.shape.rank == 0 for t in inputs):
        raise ValueError(f"{kind}: cannot gather a rank-zero tensor; reshape it to [1]")
    op_name = _op_name(kind, inputs, name, ignore_name_scope)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return _run([_allgather_job(xs, op_name, process_set, grouped)], kind)[0]

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor]:
        return _own_rows(dys, inputs, process_set, op_name)

    return _differentiable(forward, backward, inputs)


@_no_autograph
def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """The global rank `root_rank`'s tensor, on every member. Differentiable: the root receives the
    averaged gradient, the other ranks zeros."""
    inputs = [_tensor(tensor, "broadcast")]
    op_name = _op_name("HorovodBroadcast", inputs, name, ignore_name_scope)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return _run([_core_job("broadcast", xs, False, root_rank, op_name, process_set)], "HorovodBroadcast")[0]

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor]:
        grad = _allreduce(dys[0], None if op_name is None else f"{op_name}.grad", Average, process_set=process_set)
        return [grad if basics.rank() == root_rank else tf.zeros_like(grad)]

    return _differentiable(forward, backward, inputs)[0]


@_no_autograph
def broadcast_(variables: Sequence[tf.Variable], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Overwrite `variables` with the root's values, in place; returns their new values."""
    values = _broadcast_values(variables, root_rank, name or "broadcast_", process_set)
    for var, value in zip(variables, values):
        var.assign(value)
    return [tf.convert_to_tensor(var) for var in variables]


def _broadcast_values(variables: Sequence[Any], root_rank: int, prefix: str,
                      process_set: ProcessSet) -> list[tf.Tensor]:
    """The root's values of `variables`, all broadcast in one round."""
    jobs = [_core_job("broadcast", [_tensor(var, "broadcast")], False, root_rank,
                      f"{prefix}.{i}.{_normalize_name(getattr(var, 'name', 'var'))}", process_set)
            for i, var in enumerate(variables)]
    return [outs[0] for outs in _run(jobs, "HorovodBroadcastVariables")] if jobs else []


@_no_autograph
def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send `splits[j]` rows to member j (equal parts when None). Returns the received rows, and
    with `splits` also the received splits, as Horovod does."""
    inputs = [_tensor(tensor, "alltoall")]
    if inputs[0].shape.rank == 0:
        raise ValueError("alltoall: cannot scatter a rank-zero tensor; reshape it to [1]")
    if splits is not None:
        inputs.append(tf.cast(tf.convert_to_tensor(splits), tf.int32))
    op_name = _op_name("HorovodAlltoall", inputs[:1], name, ignore_name_scope)
    out_shapes = [_rows_unknown(inputs[0].shape), tf.TensorShape([_set_size(process_set)])]

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return _alltoall_node(xs, op_name, process_set, out_shapes)

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor | None]:
        received = outputs[1]
        grad_name = None if op_name is None else f"{op_name}.grad"
        grad = _alltoall_node([dys[0], received], grad_name, process_set, out_shapes)[0]
        return [grad] + [None] * (len(inputs) - 1)

    outputs = _differentiable(forward, backward, inputs)
    return outputs[0] if splits is None else (outputs[0], outputs[1])


def _alltoall_node(xs: list[tf.Tensor], name: str | None, process_set: ProcessSet, shapes: list) -> list[tf.Tensor]:
    def start(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
        handle = core.alltoall_async(arrays[0], arrays[1] if len(arrays) > 1 else None, name, process_set)
        return lambda: list(handle.wait())

    return _run([_Job(xs, [xs[0].dtype, tf.int32], shapes, start)], "HorovodAlltoall")[0]


def _reducescatter(tensors: Sequence[Any], name: str | None, op: int, prescale_factor: float,
                   postscale_factor: float, ignore_name_scope: bool, process_set: ProcessSet,
                   grouped: bool) -> list[tf.Tensor]:
    inputs = [_tensor(t, "reducescatter") for t in tensors]
    if not inputs:
        return []
    if op not in (Average, Sum):
        raise ValueError("reducescatter supports op=Average and op=Sum only")
    kind = "HorovodGroupedReducescatter" if grouped else "HorovodReducescatter"
    op_name = _op_name(kind, inputs, name, ignore_name_scope)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        job = _core_job("reducescatter", xs, grouped, op_name, op, prescale_factor, postscale_factor, process_set)
        return _run([job], kind)[0]

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor]:
        # The rows of every rank come back to all ranks; a Sum spreads each input row to all of
        # them, so its gradient counts set-size times (Horovod's convention), times the scaling.
        factor = prescale_factor * postscale_factor * (_set_size(process_set) if op == Sum else 1)
        grad_name = None if op_name is None else f"{op_name}.grad"
        gathered = _run([_allgather_job(dys, grad_name, process_set, grouped)], kind + "Grad")[0]
        return [g * tf.cast(factor, g.dtype) if factor != 1 else g for g in gathered]

    return _differentiable(forward, backward, inputs)


@_no_autograph
def reducescatter(tensor: Any, device_dense: str = "", compression: type[Compressor] = Compression.none,
                  op: int = Average, name: str | None = None, process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce across the set and keep this rank's block of dim 0 (the first dim0 % n ranks get one
    extra row). Average (default) or Sum."""
    compressed, ctx = compression.compress(_tensor(tensor, "reducescatter"))
    out = _reducescatter([compressed], name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set,
                         grouped=False)[0]
    return compression.decompress(out, ctx)


@_no_autograph
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: str | None = None) -> list[tf.Tensor]:
    pairs = [compression.compress(_tensor(t, "grouped_reducescatter")) for t in tensors]
    out = _reducescatter([c for c, _ in pairs], name, op, prescale_factor, postscale_factor, ignore_name_scope,
                         process_set, grouped=True)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, pairs)]


@_no_autograph
def join() -> tf.Tensor:
    """Declare that this rank has no more data: until every rank joined, it contributes zeros to
    the others' allreduces. Returns the global rank that joined last (an int32 scalar)."""

    def start(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
        handle = core.join_async()
        return lambda: [np.asarray(handle.wait(), np.int32)]

    return _run([_Job([], [tf.int32], [tf.TensorShape([])], start)], "HorovodJoin")[0][0]


# -- topology as graph values -----------------------------------------------------------------------
def _scalar_op(value: Callable[[], int], name: str | None) -> tf.Tensor:
    """An int32 scalar computed when the graph runs (not when it is traced)."""
    if tf.executing_eagerly():
        return tf.constant(value(), tf.int32)
    out = tf.py_function(lambda: np.int32(value()), [], Tout=tf.int32, name=name or "HorovodTopology")
    out.set_shape([])
    return out


def _process_set_by_id(process_set_id: int) -> ProcessSet:
    sets = basics.runtime().process_sets
    if process_set_id not in sets:
        raise ValueError(f"process set {process_set_id} is not registered")
    return sets[process_set_id]


@_no_autograph
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    return _scalar_op(lambda: len(_process_set_by_id(process_set_id).ranks), name)


@_no_autograph
def local_size_op(name: str | None = None) -> tf.Tensor:
    return _scalar_op(basics.local_size, name)


@_no_autograph
def rank_op(name: str | None = None) -> tf.Tensor:
    return _scalar_op(basics.rank, name)


@_no_autograph
def local_rank_op(name: str | None = None) -> tf.Tensor:
    return _scalar_op(basics.local_rank, name)


@_no_autograph
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 if this rank belongs to the set, 0 if not; -1 before init, -3 for an unknown set
    (Horovod's error codes)."""

    def included() -> int:
        if not basics.is_initialized():
            return -1
        sets = basics.runtime().process_sets
        return -3 if process_set_id not in sets else int(basics.rank() in sets[process_set_id].ranks)

    return _scalar_op(included, name)


__all__ = [
    "allgather", "allreduce", "alltoall", "broadcast", "broadcast_", "grouped_allgather",
    "grouped_allreduce", "grouped_reducescatter", "join", "local_rank_op", "local_size_op",
    "process_set_included_op", "rank_op", "reducescatter", "size_op",
]
