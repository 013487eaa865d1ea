"""TensorFlow tensors <-> the host buffers the core moves, eager and inside `tf.function`.

How one collective runs:

* Eager: the tensors' numpy arrays (no copy on CPU) go to `horovod.common.ops`, the result comes
  back as a new tensor.
* Traced (`tf.function`, Keras `fit`): the same Python body runs in one `tf.py_function` node
  whose outputs carry the static shapes we know. `tf.function` runs stateful nodes (a
  py_function is one) in program order, so every rank reaches its collectives in the same
  order, however many threads the executor has.
* TF1 graph (`tf.compat.v1.Session`): no such order, so a collective is a submit node that never
  blocks and a wait node that holds no inter-op thread (`_session_node`): no order of the
  session's threads on any rank can deadlock.
* Collectives that belong together (all gradients of a step) are `Job`s of one node: all are
  submitted before any is waited on, so the engine negotiates them in one round and fuses them.

Gradients come from `tf.custom_gradient` (`differentiable`), so no op gradient needs registering.

Names: an unnamed op in eager mode gets the core's `noname.<n>`; in a traced graph it is named
after its input tensor (`HorovodAllreduce_<tensor>`), made unique within the graph, and an
explicit name is prefixed with the current name scope unless `ignore_name_scope` (`op_name`).
Every rank traces the same program, so the names agree.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.ops import control_flow_util

from horovod.common import basics, ops
from horovod.common.collective_rules import CORE_CALLS, KEEPS_SHAPE
from horovod.common.process_sets import ProcessSet
from horovod.common.reduce_ops import DTYPE_NAMES, Adasum, Average
from horovod.tensorflow._session_node import session_node

# Public entry points are not rewritten by AutoGraph when called from a tf.function: they are
# plain Python that builds the graph as it is.
no_autograph = tf.autograph.experimental.do_not_convert

SUPPORTED_DTYPES = tuple(tf.as_dtype(name) for name in DTYPE_NAMES)


# -- running collectives as eager calls or graph nodes ------------------------------------------------
class Job:
    """One core collective inside a node.

    `start(arrays)` submits it and returns a function that waits and returns the output arrays;
    `dtypes` and `shapes` describe those outputs (shapes may have unknown dims)."""

    __slots__ = ("inputs", "dtypes", "shapes", "start")

    def __init__(self, inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType], shapes: Sequence[Any],
                 start: Callable[[list[np.ndarray]], Callable[[], list[np.ndarray]]]) -> None:
        self.inputs, self.dtypes, self.shapes, self.start = list(inputs), list(dtypes), list(shapes), start


def _submit(jobs: Sequence[Job], arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
    """Submit every job now; the returned function waits for all of them (their outputs, flat)."""
    waits, at = [], 0
    for job in jobs:
        waits.append(job.start(arrays[at:at + len(job.inputs)]))
        at += len(job.inputs)
    return lambda: [out for wait in waits for out in wait()]


def _host_run(jobs: Sequence[Job], tensors: Sequence[tf.Tensor]) -> list[np.ndarray]:
    """Submit every job, then wait for every job (eager tensors in, numpy arrays out): one batch
    that this thread runs itself (`ops.submit_waited`)."""
    return ops.submit_waited(_submit, jobs, [np.asarray(t.numpy()) for t in tensors])()


def run(jobs: Sequence[Job], label: str = "HorovodCollective") -> list[list[tf.Tensor]]:
    """Run `jobs` together (eagerly, or as one node of the graph being traced); their outputs."""
    flat = [t for job in jobs for t in job.inputs]
    dtypes = [d for job in jobs for d in job.dtypes]
    if tf.executing_eagerly():
        outputs = [tf.convert_to_tensor(r, dtype=d) for r, d in zip(_host_run(jobs, flat), dtypes)]
    else:
        refuse_xla(label)
        if in_function():
            outputs = tf.py_function(lambda *tensors: _host_run(jobs, tensors), flat, Tout=dtypes, name=label)
        else:
            outputs = session_node(flat, dtypes, partial(_submit, jobs), label)
        set_shapes(jobs, outputs)
    return per_job(jobs, outputs)


def in_function() -> bool:
    """True while a `tf.function` is being traced (not eagerly, not in a TF1 graph)."""
    return not tf.executing_eagerly() and isinstance(tf.compat.v1.get_default_graph(), FuncGraph)


def set_shapes(jobs: Sequence[Job], outputs: Sequence[tf.Tensor]) -> None:
    """Give the graph outputs of `jobs` (flat, in job order) the static shapes the jobs know."""
    for out, shape in zip(outputs, (s for job in jobs for s in job.shapes)):
        out.set_shape(shape)


def per_job(jobs: Sequence[Job], outputs: Sequence[tf.Tensor]) -> list[list[tf.Tensor]]:
    """The flat `outputs` of `jobs`, split into one list per job."""
    grouped, at = [], 0
    for job in jobs:
        grouped.append(list(outputs[at:at + len(job.dtypes)]))
        at += len(job.dtypes)
    return grouped


def refuse_xla(label: str) -> None:
    """Fail while tracing, naming the function, rather than when XLA compiles it: a collective is a
    call back into Python (`tf.py_function`), which XLA cannot make. Horovod compiles its
    collectives into XLA custom calls from C++; a pure-Python package has no way to register one."""
    graph = tf.compat.v1.get_default_graph()
    if control_flow_util.GraphOrParentsInXlaContext(graph):
        raise NotImplementedError(
            f"{label} inside tf.function(jit_compile=True) (function {graph.name!r}): XLA cannot call back into "
            "Python, and khorovod's collectives run there. Keep the Horovod calls outside the jit-compiled "
            "function (compile the model's forward and backward, reduce the gradients outside), or drop "
            "jit_compile=True (Keras: model.compile(jit_compile=False)).")


def differentiable(forward: Callable[[list[tf.Tensor]], list[tf.Tensor]],
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
def normalize_name(name: str) -> str:
    """`name` with every character a core op name cannot hold replaced by `_`."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def checked_tensor(value: Any, what: str) -> tf.Tensor:
    """`value` as a tensor of a dtype the core moves; ValueError naming `what` otherwise."""
    tensor = tf.convert_to_tensor(value)
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{what}: tensor type {tensor.dtype.name} is not supported; supported types: "
                         f"{', '.join(d.name for d in SUPPORTED_DTYPES)}")
    return tensor


def op_name(default: str, tensors: Sequence[tf.Tensor], name: str | None, ignore_name_scope: bool) -> str | None:
    """The name the core sees (see the module docstring); None means the core's `noname.<n>`."""
    if tf.executing_eagerly():
        return name
    graph = tf.compat.v1.get_default_graph()
    if name is None:
        name = f"{default}_{normalize_name(tensors[0].name)}"
        if len(tensors) > 1:
            name += f"_{normalize_name(tensors[-1].name)}"
    elif not ignore_name_scope and graph.get_name_scope():
        name = f"{graph.get_name_scope()}/{name}"
    return graph.unique_name(name)


def grad_name(name: str | None) -> str | None:
    """The name of the collectives that carry the gradient of op `name`."""
    return None if name is None else f"{name}.grad"


def set_size(process_set: ProcessSet) -> int:
    process_set.require_registered()
    return len(process_set.ranks)


def set_rank(process_set: ProcessSet) -> int:
    rank = process_set.rank()
    if rank is None:
        raise ValueError(f"rank {basics.rank()} is not a member of {process_set}")
    return rank


def rows_unknown(shape: tf.TensorShape) -> tf.TensorShape:
    """`shape` with dim 0 left to the run (what the other members send decides it)."""
    return tf.TensorShape([None]).concatenate(shape[1:]) if shape.rank else tf.TensorShape(None)


def check_sparse_op(op: int) -> None:
    """IndexedSlices are combined by gathering them, whatever the op (as Horovod does: Min, Max and
    Product gather like Sum, and the slices add up where they are applied); only Adasum, which
    needs dense vectors, is refused."""
    if op == Adasum:
        raise NotImplementedError("allreduce of tf.IndexedSlices does not support op=Adasum; convert the "
                                  "gradient to a dense tensor (sparse_as_dense=True)")


# -- jobs: one per core collective ---------------------------------------------------------------------
def core_job(kind: str, tensors: Sequence[tf.Tensor], grouped: bool, *args: Any) -> Job:
    """A job calling the core's `kind` on `tensors` (as one group when `grouped`) with `args`."""
    single, group = CORE_CALLS[kind]

    def start(arrays: list[np.ndarray]) -> Callable[[], list[np.ndarray]]:
        if grouped:
            return group(arrays, *args).wait  # type: ignore[misc]
        handle = single(arrays[0], *args)
        return lambda: [handle.wait()]

    same_shape = kind in KEEPS_SHAPE
    shapes = [t.shape if same_shape else rows_unknown(t.shape) for t in tensors]
    return Job(tensors, [t.dtype for t in tensors], shapes, start)


def allreduce_job(tensors: Sequence[tf.Tensor], name: str | None, op: int, prescale: float, postscale: float,
                  process_set: ProcessSet, grouped: bool) -> Job:
    return core_job("allreduce", tensors, grouped, name, op, prescale, postscale, process_set)


def allgather_job(tensors: Sequence[tf.Tensor], name: str | None, process_set: ProcessSet, grouped: bool) -> Job:
    return core_job("allgather", tensors, grouped, name, process_set)


def average_and_gather_rows(grads: list[tf.Tensor], inputs: Sequence[tf.Tensor], process_set: ProcessSet,
                            name: str | None) -> tuple[list[tf.Tensor], tf.Tensor]:
    """The Average-allreduce of `grads` and every member's dim 0 of each input, in one node."""
    sizes_name = None if name is None else f"{name}_sizes"
    dims0 = tf.stack([tf.shape(t, out_type=tf.int64)[0] for t in inputs])[tf.newaxis]
    jobs = [allreduce_job(grads, name, Average, 1.0, 1.0, process_set, grouped=len(grads) > 1),
            allgather_job([dims0], sizes_name, process_set, grouped=False)]
    reduced, (sizes,) = run(jobs, "HorovodAllgatherGrad")
    return reduced, sizes


def broadcast_values(variables: Sequence[Any], root_rank: int, prefix: str,
                     process_set: ProcessSet) -> list[tf.Tensor]:
    """The root's values of `variables`, all broadcast in one round."""
    jobs = [core_job("broadcast", [checked_tensor(var, "broadcast")], False, root_rank,
                     f"{prefix}.{i}.{normalize_name(getattr(var, 'name', 'var'))}", process_set)
            for i, var in enumerate(variables)]
    return [outs[0] for outs in run(jobs, "HorovodBroadcastVariables")] if jobs else []
