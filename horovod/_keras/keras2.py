"""`DistributedOptimizer` for Keras 2 optimizers: `tf_keras` (what `tf.keras` is under
`TF_USE_LEGACY_KERAS=1` on TensorFlow 2.16+), its `optimizers.legacy.*` included.

Keras 2 drives an optimizer through its own methods (`minimize` -> `_compute_gradients` for the
legacy optimizers, `compute_gradients` for the new ones -> `apply_gradients`; TF1-graph Keras
through `get_gradients`), so, as Horovod does, the distributed optimizer is a subclass of the
wrapped optimizer's class, with the same name: `get_config`/`from_config` are the wrapped
optimizer's, a saved model names the plain optimizer, and `load_model` turns it back into a
distributed one. The gradients are reduced where they are computed (both spellings,
`_compute_gradients` included, work on both kinds of optimizer); `apply_gradients` reduces those
that were not (a custom loop that computes them with a tape).

With `backward_passes_per_step = k > 1` the object Horovod calls `optimizer._agg_helper`
(`Keras2Aggregation`) sums each call's gradients on this rank and reduces the sums on every k-th
call; `apply_gradients` applies on that call only and counts the others in `iterations`, as
Horovod does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from horovod._keras.optimizer import dense_gradient
from horovod.common.gradients import GradientReducer
from horovod.tensorflow.gradient_tape import allreduce_gradients


def _done(result: Any) -> tf.Tensor:
    """A value for a `tf.cond` branch that ran `result`'s ops (branches must return alike)."""
    deps = [x for x in tf.nest.flatten(result) if isinstance(x, (tf.Tensor, tf.Operation))]
    with tf.control_dependencies(deps):
        return tf.constant(True)


class Keras2Aggregation:
    """Local sums of `passes` calls' gradients, reduced once (Horovod's `optimizer._agg_helper`).

    `counter` is the number of calls summed since the last reduction (0 right after one)."""

    def __init__(self, reduce: Callable[[list[Any], list[Any]], list[Any]], passes: int, average: bool,
                 sparse_as_dense: bool, register: Callable[[Any], None]) -> None:
        self._reduce, self.backward_passes_per_step, self.average_aggregated_gradients = reduce, passes, average
        self.sparse_as_dense, self.register_local_var = sparse_as_dense, register
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="aggregation_counter")
        self.locally_aggregated_grads: list[tf.Variable] = []

    def compute_gradients(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """Add `grads` to the sums; on every `passes`-th call return the reduced sums (divided by
        `passes` when averaging) and clear them, on the others the sums so far. None stays None."""
        grads = [None if g is None else tf.convert_to_tensor(dense_gradient(g, self.sparse_as_dense)) for g in grads]
        present = [k for k, g in enumerate(grads) if g is not None]
        if not self.locally_aggregated_grads:
            with tf.init_scope():
                self.locally_aggregated_grads = [tf.Variable(tf.zeros(grads[k].shape, grads[k].dtype),
                                                             trainable=False) for k in present]
        sums = self.locally_aggregated_grads
        if len(sums) != len(present):
            raise ValueError(f"backward_passes_per_step > 1: this call has {len(present)} gradients, the first "
                             f"had {len(sums)}; every call must pass the same variables")
        for total, k in zip(sums, present):
            total.assign_add(grads[k])
        self.counter.assign_add(1)

        def reduce_and_clear() -> list[tf.Tensor]:
            reduced = self._reduce([total.read_value() for total in sums], [variables[k] for k in present])
            if self.average_aggregated_gradients:
                reduced = [g / self.backward_passes_per_step for g in reduced]
            with tf.control_dependencies(reduced):
                clear = [total.assign(tf.zeros_like(total)) for total in sums] + [self.counter.assign(0)]
            with tf.control_dependencies(clear):
                return [tf.identity(g) for g in reduced]

        def summed() -> list[tf.Tensor]:
            return [total.read_value() for total in sums]

        values = tf.cond(tf.equal(self.counter, self.backward_passes_per_step), reduce_and_clear, summed)
        out: list[Any] = [None] * len(grads)
        for k, value in zip(present, values if isinstance(values, (list, tuple)) else [values]):
            out[k] = value
        return out

    def apply_gradients(self, apply: Callable[[], Any], optimizer: Any) -> Any:
        """`apply()` on the call that reduced; the other calls only count in `optimizer.iterations`."""
        return tf.cond(tf.equal(self.counter, 0), lambda: _done(apply()),
                       lambda: _done(optimizer.iterations.assign_add(1)))


class _Distributed:
    """The methods a Keras 2 optimizer class gets when it is made distributed (see the module)."""

    _hvd_reducer: GradientReducer
    _agg_helper: Keras2Aggregation | None

    def hvd_setup(self, reducer: GradientReducer, sparse_as_dense: bool, passes: int, average: bool) -> None:
        """Attach the reduction (the instance was made by `from_config` or restored by `load_model`,
        so there is no constructor of ours to pass it to)."""
        self._hvd_reducer, self._hvd_sparse_as_dense = reducer, sparse_as_dense
        self._hvd_reduced = False  # the gradients about to be applied were reduced (set while tracing)
        self._agg_helper = None
        if passes > 1:
            self._agg_helper = Keras2Aggregation(self._allreduce_grads, passes, average, sparse_as_dense,
                                                 self.register_local_var)

    def register_local_var(self, var: Any) -> None:
        """Keep `var`'s gradient on this rank (divided by the set size when `scale_local_gradients`)."""
        self._hvd_reducer.register_local_source(var)

    def _allreduce_grads(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """`grads` reduced across ranks now (Horovod's name for it)."""
        return allreduce_gradients(self._hvd_reducer, list(grads), list(variables), self._hvd_sparse_as_dense)

    def _allreduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> list[Any]:
        """This call's gradients reduced, or summed towards the next reduction (Horovod's name for it)."""
        self._hvd_reduced = True
        if self._agg_helper is not None:
            return self._agg_helper.compute_gradients(list(grads), list(variables))
        return self._allreduce_grads(grads, variables)

    # -- where Keras 2 computes gradients -------------------------------------------------------
    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None, tape: Any = None) -> list:
        base = super()
        if hasattr(base, "_compute_gradients"):  # optimizers.legacy
            pairs = base._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape)  # type: ignore[misc]
        else:  # tf_keras's new optimizers only have the public spelling
            if grad_loss is not None:
                raise ValueError(f"{type(self).__name__}._compute_gradients: grad_loss needs an optimizer from "
                                 "tf.keras.optimizers.legacy (the new optimizers do not take it)")
            if not callable(var_list):  # nested lists are flattened, as the legacy spelling does
                var_list = tf.nest.flatten(var_list)
            pairs = base.compute_gradients(loss, var_list, tape=tape)  # type: ignore[misc]
        return self._hvd_reduced_pairs(pairs)

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> list:
        pairs = super().compute_gradients(loss, var_list, tape=tape)  # type: ignore[misc]
        return self._hvd_reduced_pairs(pairs)

    def get_gradients(self, loss: Any, params: Any) -> list[Any]:
        return self._allreduce(super().get_gradients(loss, params), params)  # type: ignore[misc]

    def _hvd_reduced_pairs(self, pairs: Any) -> list:
        pairs = list(pairs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        return list(zip(self._allreduce(grads, variables), variables))

    # -- applying -------------------------------------------------------------------------------------
    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        if not self._hvd_reduced and pairs:
            grads, variables = zip(*pairs)
            pairs = list(zip(self._allreduce(grads, variables), variables))
        self._hvd_reduced = False
        apply = super().apply_gradients  # type: ignore[misc]
        if self._agg_helper is None:
            return apply(pairs, *args, **kwargs)
        self._hvd_build([v for _, v in pairs])
        return self._agg_helper.apply_gradients(lambda: apply(pairs, *args, **kwargs), self)

    def _hvd_build(self, variables: list[Any]) -> None:
        """The optimizer's own state (slots, `iterations`), created outside the `tf.cond` of a step."""
        build_optimizer_state(self, variables)


def build_optimizer_state(optimizer: Any, variables: Sequence[Any]) -> None:
    """Create a Keras 2 optimizer's variables for `variables` now (it makes them at its first step)."""
    with tf.init_scope():
        _ = optimizer.iterations
        if hasattr(optimizer, "_create_all_weights"):  # optimizers.legacy: slots
            optimizer._create_all_weights(list(variables))
        else:
            optimizer.build(list(variables))  # does nothing once built


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
