"""`DistributedGradientTape`, and the TensorFlow transport of one step's gradients that the
tape and the optimizers share."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Iterator, Sequence

import tensorflow as tf

from horovod.common.gradients import GradientReducer, Plan
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average
from horovod.tensorflow.compression import Compression, Compressor
from horovod.common.collective_rules import sparse_values_factor
from horovod.tensorflow import backward_overlap
from horovod.tensorflow._bridge import Job, allgather_job, check_sparse_op, no_autograph, run, set_size


@no_autograph
def allreduce_gradients(reducer: GradientReducer, grads: Sequence[Any], variables: Sequence[Any],
                        sparse_as_dense: bool = False) -> list[Any]:
    """`grads` (tensors, IndexedSlices or None) reduced across ranks as `reducer` says, in one
    node of the graph (or one eager round)."""
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    return reducer.reduce(grads, variables, partial(_transport, reducer), _scale)


def _scale(grad: Any, factor: float) -> Any:
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _transport(reducer: GradientReducer, tensors: list[Any], plan: Plan) -> list[Any]:
    """Dense gradients go through the reducer's allreduces; IndexedSlices are allgathered
    (values and indices). All in one node, or, inside a `tf.function`, each allreduce group and
    each allgather submitted as soon as backward has produced its input (`backward_overlap`)."""
    overlap = backward_overlap.enabled()
    dense = [k for k, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse = [k for k, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    carried: list[tuple[list[int], Job]] = []  # (positions in `tensors` a job carries, the job)
    if dense:
        dense_plan = plan.restricted(dense)
        parts = dense_plan.parts() if overlap else [(tuple(range(len(dense))), dense_plan)]
        for members, part in parts:
            inputs = [tensors[dense[k]] for k in members]
            carried.append(([dense[k] for k in members],
                            Job(inputs, [t.dtype for t in inputs], [t.shape for t in inputs],
                                partial(reducer.submit, plan=part))))
    if sparse:
        check_sparse_op(reducer.op)
    for k in sparse:
        for part in ("values", "indices"):
            carried.append(([k], allgather_job([getattr(tensors[k], part)], f"{plan.names[k]}.{part}",
                                               reducer.process_set, grouped=False)))
    carried.sort(key=lambda entry: min(entry[0]))  # gradient-list order (stable: values before indices)
    jobs = [job for _, job in carried]
    label = "HorovodAllreduceGradients"
    results = backward_overlap.run_in_backward_order(jobs, label) if overlap else run(jobs, label)
    out: list[Any] = [None] * len(tensors)
    gathered: dict[int, list[tf.Tensor]] = {}
    for (positions, _), result in zip(carried, results):
        if isinstance(tensors[positions[0]], tf.IndexedSlices):
            gathered.setdefault(positions[0], []).extend(result)
        else:
            for k, reduced in zip(positions, result):
                out[k] = reduced
    factor = reducer.prescale * reducer.postscale
    if sparse:
        factor = sparse_values_factor(reducer.op, factor, set_size(reducer.process_set))
    for k, (values, indices) in gathered.items():
        slices = tf.IndexedSlices(values, indices, tensors[k].dense_shape)
        out[k] = _scale(slices, factor) if factor != 1 else slices
    return out


class DistributedGradientTape(tf.GradientTape):
    """A gradient tape whose `gradient()` returns gradients averaged (by default) across ranks.

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    It wraps the given tape rather than copying it: recording, `watch`, `stop_recording`,
    `reset`, `jacobian` ... are the wrapped tape's. Gradients of variables passed to
    `register_local_source` stay on this rank (divided by the set size when
    `scale_local_gradients`). `device_dense`/`device_sparse` are accepted for compatibility.
    """

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                 compression: type[Compressor] = Compression.none, sparse_as_dense: bool = False,
                 op: int = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                 groups: Any = None, process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:
        # tf.GradientTape.__init__ is not called on purpose: the wrapped tape does the recording.
        if not isinstance(gradtape, tf.GradientTape):
            raise ValueError(f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}")
        self._tape_wrapped = gradtape
        self._sparse_as_dense = sparse_as_dense
        self._reducer = GradientReducer("DistributedGradientTape", op, gradient_predivide_factor, num_groups, groups,
                                        process_set, compression, scale_local_gradients)

    def register_local_source(self, source: Any) -> None:
        """Keep the gradient of `source` (a variable) on this rank: it is not allreduced."""
        self._reducer.register_local_source(source)

    @no_autograph
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE) -> Any:
        grads = self._tape_wrapped.gradient(target, sources, output_gradients, unconnected_gradients)
        flat = allreduce_gradients(self._reducer, tf.nest.flatten(grads), tf.nest.flatten(sources),
                                   self._sparse_as_dense)
        return tf.nest.pack_sequence_as(grads, flat)

    @no_autograph
    def get_local_and_global_gradients(self, target: Any, sources: Any, **kwargs: Any) -> tuple[list, list]:
        """(local gradients, global gradients) of `sources`, split by `register_local_source`."""
        grads = self.gradient(target, sources, **kwargs)
        pairs = list(zip(tf.nest.flatten(grads), tf.nest.flatten(sources)))
        local = [self._reducer.is_local(s) for _, s in pairs]
        return [g for (g, _), mine in zip(pairs, local) if mine], [g for (g, _), mine in zip(pairs, local) if not mine]

    # -- the wrapped tape's own behaviour ---------------------------------------------------------------
    def __enter__(self) -> "DistributedGradientTape":
        self._tape_wrapped.__enter__()
        return self

    def __exit__(self, typ: Any, value: Any, traceback: Any) -> None:
        self._tape_wrapped.__exit__(typ, value, traceback)

    def watch(self, tensor: Any) -> None:
        self._tape_wrapped.watch(tensor)

    @contextlib.contextmanager
    def stop_recording(self) -> Iterator[None]:
        with self._tape_wrapped.stop_recording():
            yield

    def reset(self) -> None:
        self._tape_wrapped.reset()

    def watched_variables(self) -> Any:
        return self._tape_wrapped.watched_variables()

    def jacobian(self, *args: Any, **kwargs: Any) -> Any:
        return self._tape_wrapped.jacobian(*args, **kwargs)

    def batch_jacobian(self, *args: Any, **kwargs: Any) -> Any:
        return self._tape_wrapped.batch_jacobian(*args, **kwargs)


def PartialDistributedGradientTape(gradtape: tf.GradientTape, local_layers: Any = None,
                                   **kwargs: Any) -> DistributedGradientTape:
    """A DistributedGradientTape whose `local_layers` (a Keras layer or a list of them) keep their
    gradients local."""
    tape = DistributedGradientTape(gradtape, **kwargs)
    layers = [] if local_layers is None else local_layers if isinstance(local_layers, (list, tuple)) else [local_layers]
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
