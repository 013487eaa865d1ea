"""`DistributedOptimizer` for TensorFlow: Keras 3 optimizers (the TF 2.16+ kind) and legacy
`tf.compat.v1.train.Optimizer`s."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from horovod.common.gradients import GradientReducer
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average
from horovod.tensorflow.compression import Compression, Compressor
from horovod.tensorflow.gradient_tape import allreduce_gradients


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A `tf.compat.v1.train.Optimizer` whose `compute_gradients` returns reduced gradients; the
    rest is the wrapped optimizer's.

    With `backward_passes_per_step=k > 1`, every `compute_gradients` adds the local gradients to
    accumulators; on every k-th call the accumulated sum (divided by k with
    `average_aggregated_gradients`) is reduced and returned, and only that call's
    `apply_gradients` applies. The decision is a `tf.cond` on a pass counter, so it holds in a
    TF1 graph run step after step as well as eagerly."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, reducer: GradientReducer, name: str,
                 use_locking: bool, sparse_as_dense: bool, passes_per_step: int, average_aggregated: bool) -> None:
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer
        self._sparse_as_dense = sparse_as_dense
        self._passes_per_step = passes_per_step
        self._average_aggregated = average_aggregated
        self._passes: tf.Variable | None = None  # backward passes so far (k > 1 only)
        self._sums: dict[Any, tf.Variable] = {}  # variable (by ref) -> its accumulated gradient

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
        if self._passes_per_step > 1:
            grads = self._aggregate(grads, variables)
        else:
            grads = allreduce_gradients(self._reducer, grads, variables, self._sparse_as_dense)
        return list(zip(grads, variables))

    def _aggregate(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        """Accumulate this pass; on every k-th, return the reduced sums (and clear them), else the
        local sums so far (which apply_gradients will not apply)."""
        with tf.init_scope():  # state outside any cond or function being built
            if self._passes is None:
                self._passes = tf.Variable(0, dtype=tf.int64, trainable=False, name="horovod_passes")
            for g, v in zip(grads, variables):
                if g is not None and v.ref() not in self._sums:
                    self._sums[v.ref()] = tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                                      name="horovod_aggregated_gradient")
        present = [k for k, g in enumerate(grads) if g is not None]
        sums = [self._sums[variables[k].ref()] for k in present]
        added = [s.assign_add(tf.convert_to_tensor(grads[k])) for s, k in zip(sums, present)]
        with tf.control_dependencies(added):
            passes = self._passes.assign_add(1)

        def reduce() -> list[Any]:
            totals = [tf.identity(s) for s in sums]
            if self._average_aggregated:
                totals = [t / tf.cast(self._passes_per_step, t.dtype) for t in totals]
            reduced = allreduce_gradients(self._reducer, totals, [variables[k] for k in present])
            with tf.control_dependencies(reduced):
                cleared = [s.assign(tf.zeros_like(s)) for s in sums]
            with tf.control_dependencies(cleared):
                return [tf.identity(r) for r in reduced]

        def local() -> list[Any]:
            return [tf.identity(s) for s in sums]

        if not present:
            return grads
        chosen = tf.cond(tf.equal(passes % self._passes_per_step, 0), reduce, local)
        out = list(grads)
        for k, g in zip(present, chosen):
            out[k] = g
        return out

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        if self._passes_per_step == 1 or self._passes is None:
            return self._optimizer.apply_gradients(grads_and_vars, *args, **kwargs)
        grads_and_vars = list(grads_and_vars)

        def apply() -> Any:
            with tf.control_dependencies([self._optimizer.apply_gradients(grads_and_vars, *args, **kwargs)]):
                return tf.constant(True)

        # Read the counter after this pass's compute_gradients counted it (a graph runs in any order otherwise).
        with tf.control_dependencies([g for g, _ in grads_and_vars if g is not None]):
            passes = self._passes.read_value()
        return tf.cond(tf.equal(passes % self._passes_per_step, 0), apply, lambda: tf.constant(False))

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False, device_dense: str = "",
                         device_sparse: str = "", compression: type[Compressor] = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1, op: int = Average,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True) -> Any:
    """Wrap an optimizer so that it applies gradients reduced across all ranks.

    A Keras 3 optimizer (`keras.optimizers.*`, which `tf.keras.optimizers` is on TF 2.16+) or a
    Keras 2 one (tf_keras) gets `horovod.tensorflow.keras.DistributedOptimizer`; a `tf.compat.v1.train.Optimizer` gets a
    wrapper whose `compute_gradients` reduces (and aggregates `backward_passes_per_step` passes)."""
    import keras

    from horovod._keras.optimizer import is_keras2_optimizer

    if isinstance(optimizer, keras.optimizers.Optimizer) or is_keras2_optimizer(optimizer):
        from horovod._keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer

        return KerasDistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                         gradient_predivide_factor, op, backward_passes_per_step,
                                         average_aggregated_gradients, num_groups, groups, process_set,
                                         scale_local_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        name = name or f"Distributed{type(optimizer).__name__}"
        reducer = GradientReducer(name, op, gradient_predivide_factor, num_groups, groups, process_set, compression,
                                  scale_local_gradients)
        return _DistributedOptimizer(optimizer, reducer, name, use_locking, sparse_as_dense,
                                           int(backward_passes_per_step), average_aggregated_gradients)
    raise ValueError(f"DistributedOptimizer wraps a Keras optimizer or a tf.compat.v1.train.Optimizer, "
                     f"got {type(optimizer).__name__}")
