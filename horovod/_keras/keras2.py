"""`DistributedOptimizer` for Keras 2 optimizers: `tf_keras` (what `tf.keras` is under
`TF_USE_LEGACY_KERAS=1` on TensorFlow 2.16+), its `optimizers.legacy.*` included.

Keras 2 drives an optimizer through its own methods (`minimize` -> `_compute_gradients` or
`compute_gradients` -> `apply_gradients`; TF1-graph Keras through `get_gradients`), so, as
Horovod does, the distributed optimizer is a subclass of the wrapped optimizer's class, with
the same name: `get_config`/`from_config` are the wrapped optimizer's, a saved model names the
plain optimizer, and `load_model` turns it back into a distributed one. The gradients are
reduced where they are computed; `apply_gradients` reduces those that were not (a custom loop
that computes them with a tape) and aggregates `backward_passes_per_step` calls locally.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from horovod.common.gradients import GradientReducer
from horovod.tensorflow.gradient_tape import allreduce_gradients


class _Distributed:
    """The methods a Keras 2 optimizer class gets when it is made distributed (see the module)."""

    _hvd_reducer: GradientReducer

    def hvd_setup(self, reducer: GradientReducer, sparse_as_dense: bool, passes: int, average: bool) -> None:
        """Attach the reduction (the instance was made by `from_config` or restored by `load_model`,
        so there is no constructor of ours to pass it to)."""
        self._hvd_reducer, self._hvd_sparse_as_dense = reducer, sparse_as_dense
        self._hvd_passes, self._hvd_average = passes, average
        self._hvd_reduced = False  # the gradients about to be applied were reduced (set while tracing)
        self._hvd_sums: list[tf.Variable] = []
        self._hvd_count: tf.Variable | None = None

    def register_local_source(self, variable: Any) -> None:
        """Keep `variable`'s gradient on this rank (see DistributedGradientTape)."""
        self._hvd_reducer.register_local_source(variable)

    def _hvd_reduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        return allreduce_gradients(self._hvd_reducer, list(grads), list(variables), self._hvd_sparse_as_dense)

    # -- where Keras 2 computes gradients -------------------------------------------------------
    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None, tape: Any = None) -> list:
        pairs = super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)  # type: ignore[misc]
        return self._hvd_reduced_pairs(pairs)

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> list:
        pairs = super().compute_gradients(loss, var_list, tape=tape)  # type: ignore[misc]
        return self._hvd_reduced_pairs(pairs)

    def get_gradients(self, loss: Any, params: Any) -> list[Any]:
        grads = super().get_gradients(loss, params)  # type: ignore[misc]
        if self._hvd_passes > 1:  # aggregated and reduced by apply_gradients
            return grads
        self._hvd_reduced = True
        return self._hvd_reduce(grads, params)

    def _hvd_reduced_pairs(self, pairs: Any) -> list:
        pairs = list(pairs)
        if self._hvd_passes > 1 or not pairs:
            return pairs
        grads, variables = zip(*pairs)
        self._hvd_reduced = True
        return list(zip(self._hvd_reduce(grads, variables), variables))

    # -- applying -------------------------------------------------------------------------------------
    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        grads, variables = [list(x) for x in zip(*pairs)] if pairs else ([], [])
        apply = super().apply_gradients  # type: ignore[misc]
        if self._hvd_passes == 1:
            if not self._hvd_reduced:
                grads = self._hvd_reduce(grads, variables)
            self._hvd_reduced = False
            return apply(list(zip(grads, variables)), *args, **kwargs)
        return self._hvd_aggregate(grads, variables, lambda reduced: apply(list(zip(reduced, variables)),
                                                                           *args, **kwargs))

    def _hvd_aggregate(self, grads: list[Any], variables: list[Any], apply: Any) -> Any:
        """Sum this call's gradients locally; every `passes`-th call reduce the sums and apply them."""
        self._hvd_build(variables)
        sums = self._hvd_sums[:len(variables)]
        for total, grad in zip(sums, grads):
            if grad is not None:
                total.assign_add(tf.convert_to_tensor(grad))
        count = self._hvd_count.assign_add(1)

        def reduce_and_apply() -> Any:
            scale = 1.0 / self._hvd_passes if self._hvd_average else 1.0
            summed = [None if g is None else total * scale for total, g in zip(sums, grads)]
            with tf.control_dependencies([apply(self._hvd_reduce(summed, variables))]):
                return tf.group(*[total.assign(tf.zeros_like(total)) for total in sums])

        return tf.cond(tf.equal(count % self._hvd_passes, 0), reduce_and_apply, tf.no_op)

    def _hvd_build(self, variables: list[Any]) -> None:
        """The local sums and counter, and the optimizer's own state, created outside any cond."""
        if self._hvd_count is not None:
            return
        with tf.init_scope():
            self._hvd_sums = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]
            self._hvd_count = tf.Variable(0, dtype=tf.int64, trainable=False)
        if hasattr(self, "_create_all_weights"):  # legacy OptimizerV2: slots
            self._create_all_weights(variables)
        else:
            with tf.init_scope():
                self.build(variables)  # does nothing once built


def _distributed_class(base: type) -> type:
    """`base` with `_Distributed`'s methods, under the same name (configs and saved models name it)."""
    return type(base.__name__, (_Distributed, base), {"__module__": base.__module__})


def wrap(optimizer: Any, reducer: GradientReducer, sparse_as_dense: bool, passes: int, average: bool) -> Any:
    """A new distributed optimizer with `optimizer`'s configuration."""
    if isinstance(optimizer, _Distributed):
        raise ValueError("the optimizer is already a DistributedOptimizer")
    distributed = _distributed_class(type(optimizer)).from_config(optimizer.get_config())
    distributed.hvd_setup(reducer, sparse_as_dense, passes, average)
    return distributed


def make_distributed(optimizer: Any, reducer: GradientReducer) -> Any:
    """Turn `optimizer` (one `load_model` restored, state and all) into a distributed one, in place."""
    if not isinstance(optimizer, _Distributed):
        optimizer.__class__ = _distributed_class(type(optimizer))
        optimizer.hvd_setup(reducer, False, 1, False)
    return optimizer
