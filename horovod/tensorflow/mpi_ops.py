"""Collectives on TensorFlow tensors, eager and inside `tf.function`: Horovod's public TF API.

Each collective is a `tf.custom_gradient` node over jobs of `horovod.tensorflow._bridge`, which
says how tensors reach the core (eager arrays or one `tf.py_function` node) and how ops are named.
The gradient of each collective is the framework-neutral rule of
`horovod.common.collective_rules`, applied with TensorFlow arithmetic by `_TfGradients`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from horovod.common import basics, collective_rules
from horovod.common import basics as _basics  # noqa: F401  (Horovod's tests read mpi_ops._basics)
from horovod.common import *  # noqa: F401,F403  (Horovod re-exports the core API here; scripts import it)
from horovod.common import ops as core
from horovod.common.gradients import resolve_op
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average, Sum
from horovod.tensorflow._bridge import (
    Job,
    allgather_job,
    allreduce_job,
    average_and_gather_rows,
    broadcast_values,
    check_sparse_op,
    checked_tensor,
    core_job,
    differentiable,
    grad_name,
    no_autograph,
    op_name,
    rows_unknown,
    run,
    set_rank,
    set_size,
)
from horovod.tensorflow.compression import Compression, Compressor


class _TfGradients:
    """`collective_rules.GradientCollectives` on TensorFlow tensors, for one differentiated op.

    `name` names the gradient's collectives; `kind` is the op's node label, `grouped` and
    `ignore_name_scope` its own options (the gradient of an allreduce is that same allreduce)."""

    def __init__(self, process_set: ProcessSet, name: str | None, kind: str = "", grouped: bool = False,
                 ignore_name_scope: bool = False) -> None:
        self.process_set, self.name, self.kind = process_set, name, kind
        self.grouped, self.ignore_name_scope = grouped, ignore_name_scope

    def allreduce(self, tensors: Sequence[tf.Tensor], op: int, prescale: float, postscale: float) -> list[tf.Tensor]:
        return _grouped_allreduce(tensors, self.name, op, prescale, postscale, self.ignore_name_scope,
                                  self.process_set, self.grouped)

    def allgather(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        return run([allgather_job(tensors, self.name, self.process_set, self.grouped)], self.kind + "Grad")[0]

    def alltoall(self, tensor: tf.Tensor, splits: tf.Tensor) -> tf.Tensor:
        shapes = [rows_unknown(tensor.shape), tf.TensorShape([set_size(self.process_set)])]
        return _alltoall_node([tensor, splits], self.name, self.process_set, shapes)[0]

    def average_and_gather_rows(self, tensors: Sequence[tf.Tensor],
                                inputs: Sequence[tf.Tensor]) -> tuple[list[tf.Tensor], tf.Tensor]:
        return average_and_gather_rows(list(tensors), inputs, self.process_set, self.name)

    def rows_before(self, rows: tf.Tensor, member: int) -> tf.Tensor:
        return tf.reduce_sum(rows[:member], axis=0)

    def narrow(self, tensor: tf.Tensor, starts: tf.Tensor, k: int, like: tf.Tensor) -> tf.Tensor:
        begin = tf.concat([starts[k:k + 1], tf.zeros([tensor.shape.rank - 1], tf.int64)], 0)
        return tf.slice(tensor, begin, tf.shape(like, out_type=tf.int64))

    def scale(self, tensor: tf.Tensor, factor: float) -> tf.Tensor:
        return tensor * tf.cast(factor, tensor.dtype)

    def zeros_like(self, tensor: tf.Tensor) -> tf.Tensor:
        # Zeros that still depend on `tensor`: a constant (what zeros_like of a known shape is) would
        # let a TF1 session prune the collective that made `tensor` on this rank only.
        with tf.control_dependencies([tensor]):
            return tf.zeros_like(tensor)


# -- the collectives -----------------------------------------------------------------------------------
@no_autograph
def _grouped_allreduce(tensors: Sequence[Any], name: str | None = None, op: int = Sum, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, ignore_name_scope: bool = False,
                       process_set: ProcessSet = global_process_set, grouped: bool = True) -> list[tf.Tensor]:
    """Dense allreduce of a list (one core call per list when `grouped`) without compression;
    differentiable: the gradient is reduced the same way."""
    inputs = [checked_tensor(t, "allreduce") for t in tensors]
    if not inputs:
        return []
    kind = "HorovodGroupedAllreduce" if grouped else "HorovodAllreduce"

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        job = allreduce_job(xs, op_name(kind, xs, name, ignore_name_scope), op, prescale_factor,
                            postscale_factor, process_set, grouped)
        return run([job], kind)[0]

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor]:
        collectives = _TfGradients(process_set, name, kind, grouped, ignore_name_scope)
        return collective_rules.allreduce_gradient(collectives, dys, op, prescale_factor, postscale_factor)

    return differentiable(forward, backward, inputs)


@no_autograph
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
    compressed, ctx = compression.compress(checked_tensor(tensor, "allreduce"))
    reduced = _grouped_allreduce([compressed], name, op, prescale_factor, postscale_factor, ignore_name_scope,
                                 process_set, grouped=False)[0]
    return compression.decompress(reduced, ctx)


def _sparse_allreduce(slices: tf.IndexedSlices, op: int, factor: float, name: str | None, ignore_name_scope: bool,
                      process_set: ProcessSet) -> tf.IndexedSlices:
    check_sparse_op(op)
    values = allgather(slices.values, None if name is None else f"{name}.values", ignore_name_scope, process_set)
    indices = allgather(slices.indices, None if name is None else f"{name}.indices", ignore_name_scope,
                        process_set)
    factor = collective_rules.sparse_values_factor(op, factor, set_size(process_set))
    if factor != 1.0:
        values = values * tf.cast(factor, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


@no_autograph
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
    pairs = [compression.compress(checked_tensor(t, "grouped_allreduce")) for t in tensors]
    reduced = _grouped_allreduce([c for c, _ in pairs], name, op, prescale_factor, postscale_factor,
                                 ignore_name_scope, process_set)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


@no_autograph
def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every member's tensor along dim 0 (dim 0 may differ between ranks)."""
    return _allgather([tensor], name, ignore_name_scope, process_set, grouped=False)[0]


@no_autograph
def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """`allgather` of each tensor of the list, as one unit (differentiable)."""
    return _allgather(tensors, name, ignore_name_scope, process_set, grouped=True)


def _allgather(tensors: Sequence[Any], name: str | None, ignore_name_scope: bool, process_set: ProcessSet,
               grouped: bool) -> list[tf.Tensor]:
    inputs = [checked_tensor(t, "allgather") for t in tensors]
    if not inputs:
        return []
    kind = "HorovodGroupedAllgather" if grouped else "HorovodAllgather"
    if any(t.shape.rank == 0 for t in inputs):
        raise ValueError(f"{kind}: cannot gather a rank-zero tensor; reshape it to [1]")
    full_name = op_name(kind, inputs, name, ignore_name_scope)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return run([allgather_job(xs, full_name, process_set, grouped)], kind)[0]

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor]:
        collectives = _TfGradients(process_set, grad_name(full_name))
        return collective_rules.allgather_gradient(collectives, dys, inputs, set_rank(process_set))

    return differentiable(forward, backward, inputs)


@no_autograph
def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """The global rank `root_rank`'s tensor, on every member. Differentiable: the root receives the
    averaged gradient, the other ranks zeros."""
    inputs = [checked_tensor(tensor, "broadcast")]
    full_name = op_name("HorovodBroadcast", inputs, name, ignore_name_scope)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return run([core_job("broadcast", xs, False, root_rank, full_name, process_set)], "HorovodBroadcast")[0]

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor]:
        collectives = _TfGradients(process_set, grad_name(full_name))
        return [collective_rules.broadcast_gradient(collectives, dys[0], root_rank, basics.rank())]

    return differentiable(forward, backward, inputs)[0]


@no_autograph
def broadcast_(variables: Sequence[tf.Variable], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """Overwrite `variables` with the root's values, in place; returns their new values."""
    values = broadcast_values(variables, root_rank, name or "broadcast_", process_set)
    for var, value in zip(variables, values):
        var.assign(value)
    return [tf.convert_to_tensor(var) for var in variables]


@no_autograph
def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send `splits[j]` rows to member j (equal parts when None). Returns the received rows, and
    with `splits` also the received splits, as Horovod does."""
    inputs = [checked_tensor(tensor, "alltoall")]
    if inputs[0].shape.rank == 0:
        raise ValueError("alltoall: cannot scatter a rank-zero tensor; reshape it to [1]")
    if splits is not None:
        inputs.append(tf.cast(tf.convert_to_tensor(splits), tf.int32))
    full_name = op_name("HorovodAlltoall", inputs[:1], name, ignore_name_scope)
    out_shapes = [rows_unknown(inputs[0].shape), tf.TensorShape([set_size(process_set)])]

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        return _alltoall_node(xs, full_name, process_set, out_shapes)

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor | None]:
        collectives = _TfGradients(process_set, grad_name(full_name))
        grad = collective_rules.alltoall_gradient(collectives, dys[0], outputs[1])
        return [grad] + [None] * (len(inputs) - 1)

    outputs = differentiable(forward, backward, inputs)
    return outputs[0] if splits is None else (outputs[0], outputs[1])


def _alltoall_node(xs: list[tf.Tensor], name: str | None, process_set: ProcessSet, shapes: list) -> list[tf.Tensor]:
    def start(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
        handle = core.alltoall_async(arrays[0], arrays[1] if len(arrays) > 1 else None, name, process_set)
        return lambda: list(handle.wait())

    return run([Job(xs, [xs[0].dtype, tf.int32], shapes, start)], "HorovodAlltoall")[0]


def _reducescatter(tensors: Sequence[Any], name: str | None, op: int, prescale_factor: float,
                   postscale_factor: float, ignore_name_scope: bool, process_set: ProcessSet,
                   grouped: bool) -> list[tf.Tensor]:
    inputs = [checked_tensor(t, "reducescatter") for t in tensors]
    if not inputs:
        return []
    kind = "HorovodGroupedReducescatter" if grouped else "HorovodReducescatter"
    full_name = op_name(kind, inputs, name, ignore_name_scope)
    core.check_reducescatter_op(op, full_name)

    def forward(xs: list[tf.Tensor]) -> list[tf.Tensor]:
        job = core_job("reducescatter", xs, grouped, full_name, op, prescale_factor, postscale_factor, process_set)
        return run([job], kind)[0]

    def backward(dys: list[tf.Tensor]) -> list[tf.Tensor]:
        collectives = _TfGradients(process_set, grad_name(full_name), kind, grouped)
        return collective_rules.reducescatter_gradient(collectives, dys, op, prescale_factor, postscale_factor,
                                                       set_size(process_set))

    return differentiable(forward, backward, inputs)


@no_autograph
def reducescatter(tensor: Any, device_dense: str = "", compression: type[Compressor] = Compression.none,
                  op: int = Average, name: str | None = None, process_set: ProcessSet = global_process_set,
                  ignore_name_scope: bool = False, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce across the set and keep this rank's block of dim 0 (the first dim0 % n ranks get one
    extra row). Average (default) or Sum."""
    compressed, ctx = compression.compress(checked_tensor(tensor, "reducescatter"))
    out = _reducescatter([compressed], name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set,
                         grouped=False)[0]
    return compression.decompress(out, ctx)


@no_autograph
def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "",
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: str | None = None) -> list[tf.Tensor]:
    """`reducescatter` of each tensor of the list, as one unit (differentiable)."""
    pairs = [compression.compress(checked_tensor(t, "grouped_reducescatter")) for t in tensors]
    out = _reducescatter([c for c, _ in pairs], name, op, prescale_factor, postscale_factor, ignore_name_scope,
                         process_set, grouped=True)
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(out, pairs)]


@no_autograph
def join() -> tf.Tensor:
    """Declare that this rank has no more data: until every rank joined, it contributes zeros to
    the others' allreduces. Returns the global rank that joined last (an int32 scalar)."""

    def start(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
        handle = core.join_async()
        return lambda: [np.asarray(handle.wait(), np.int32)]

    return run([Job([], [tf.int32], [tf.TensorShape([])], start)], "HorovodJoin")[0][0]


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


@no_autograph
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks of process set `process_set_id` as a TensorFlow op (a scalar), for graphs."""
    return _scalar_op(lambda: len(_process_set_by_id(process_set_id).ranks), name)


@no_autograph
def local_size_op(name: str | None = None) -> tf.Tensor:
    """`local_size()` as a TensorFlow op (a scalar), for graphs."""
    return _scalar_op(basics.local_size, name)


@no_autograph
def rank_op(name: str | None = None) -> tf.Tensor:
    """`rank()` as a TensorFlow op (a scalar), for graphs."""
    return _scalar_op(basics.rank, name)


@no_autograph
def local_rank_op(name: str | None = None) -> tf.Tensor:
    """`local_rank()` as a TensorFlow op (a scalar), for graphs."""
    return _scalar_op(basics.local_rank, name)


@no_autograph
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
