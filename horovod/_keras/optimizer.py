"""`DistributedOptimizer` for Keras 3 optimizers, on the tensorflow, torch and jax backends.

A wrapper in the manner of Keras' own `LossScaleOptimizer`: it is a `keras.optimizers.Optimizer`
holding the user's optimizer, reduces the gradients across ranks in `apply` and hands them
on. Its state *is* the wrapped optimizer's (`variables`, `iterations`, `learning_rate`), plus
the accumulators when `backward_passes_per_step > 1`. Other public attributes (`momentum`,
`beta_1`, ...) read through to the wrapped optimizer. Keras 2's spellings of that state work
too (`variables()` called, `weights`, `lr`): Horovod's example scripts were written for Keras 2.

Keras 3 calls `apply` from every backend's train step (TensorFlow through `apply_gradients`,
JAX through `stateless_apply`, which runs `apply` in a stateless scope), so this one method is
the whole integration.

Horovod builds its wrapper as a subclass of the user's optimizer class, so `type(opt).__name__`
is `"SGD"` for a wrapped SGD, and logging or checkpoint code reads that name. The instance here
is of a subclass of `DistributedOptimizer` that carries the wrapped class's name and adds
nothing else (one per optimizer class); Keras saves it under the wrapper's registered name,
so a saved model loads back through `DistributedOptimizer.from_config`.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Sequence

import keras
from keras import ops

from horovod._keras.compression import Compression, compression_name
from horovod._keras.transport import allreduce_gradients, check_backend, is_traced_jax, static_bool
from horovod.common.compression import Compressor
from horovod.common.gradients import GradientReducer
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import OP_NAMES, Average


def keras2_optimizer_types() -> tuple[type, ...]:
    """The base classes of Keras 2 optimizers loaded in this process (none without tf_keras)."""
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is None:
        return ()
    return tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer


def is_keras2_optimizer(optimizer: Any) -> bool:
    types = keras2_optimizer_types()
    return bool(types) and isinstance(optimizer, types)


class VariableList(list):
    """The optimizer's variables: a list, as Keras 3 reads `optimizer.variables`, that also
    answers a call, as Keras 2 scripts wrote it (`hvd.broadcast_variables(opt.variables(), 0)`)."""

    def __call__(self) -> "VariableList":
        return self


@keras.saving.register_keras_serializable(package="horovod")
class DistributedOptimizer(keras.optimizers.Optimizer):
    """Wrap a Keras 3 optimizer so every step applies the gradients averaged over all ranks.

        opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
        model.compile(optimizer=opt, loss=...)

    `backward_passes_per_step=n` sums the gradients of n calls locally and reduces and applies
    them on every n-th call (divided by n when `average_aggregated_gradients`); the other calls
    change no weights but count in `iterations`, as in Horovod. `device_dense`/`device_sparse`
    are accepted for compatibility.
    """

    def __new__(cls, optimizer: Any = None, *args: Any, **kwargs: Any) -> Any:
        # A Keras 2 (tf_keras) optimizer gets Keras 2's kind of distributed optimizer instead.
        if is_keras2_optimizer(optimizer):
            return keras2_distributed(optimizer, *args, **kwargs)
        # `optimizer` is None when copy/pickle rebuild an instance of an already named class.
        if isinstance(optimizer, keras.optimizers.Optimizer) and not isinstance(optimizer, DistributedOptimizer):
            cls = named_wrapper(type(optimizer))
        return super().__new__(cls)

    def __init__(self, optimizer: keras.optimizers.Optimizer, name: str | None = None, device_dense: str = "",
                 device_sparse: str = "", compression: type[Compressor] = Compression.none,
                 sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0, op: int = Average,
                 backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                 num_groups: int = 0, groups: Any = None, process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:
        check_backend()
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("the optimizer is already a DistributedOptimizer")
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ValueError(f"DistributedOptimizer wraps a Keras 3 optimizer, or a Keras 2 one from tf_keras, got "
                             f"{type(optimizer).__module__}.{type(optimizer).__name__}")
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        name = name or f"Distributed{type(optimizer).__name__}"
        super().__init__(learning_rate=0.0, name=name)
        self._optimizer = optimizer
        self._reducer = GradientReducer(name, op, gradient_predivide_factor, num_groups, groups, process_set,
                                        compression, scale_local_gradients)
        self._sparse_as_dense = sparse_as_dense
        self._passes_per_step = int(backward_passes_per_step)
        self._average_aggregated = average_aggregated_gradients
        self._gradient_predivide_factor = gradient_predivide_factor
        self._hvd_variables: list[Any] = []

    # -- the wrapped optimizer's state is ours -------------------------------------------------------
    @property
    def inner_optimizer(self) -> keras.optimizers.Optimizer:
        return self._optimizer

    @property
    def variables(self) -> "VariableList":
        return VariableList(self._optimizer.variables + list(self._hvd_variables))

    # -- Keras 2 spellings that Horovod-era scripts use on the optimizer we return --------------
    @property
    def weights(self) -> "VariableList":
        """Keras 2's name for the optimizer's variables."""
        return self.variables

    @property
    def lr(self) -> Any:
        """Keras 2's name for `learning_rate`."""
        return self.learning_rate

    @lr.setter
    def lr(self, value: Any) -> None:
        self.learning_rate = value

    @property
    def iterations(self) -> Any:
        return self._optimizer.iterations

    @property
    def learning_rate(self) -> Any:
        return self._optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self._optimizer.learning_rate = value

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: public hyperparameters of the wrapped optimizer.
        inner = self.__dict__.get("_optimizer")
        if inner is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(inner, name)

    def register_local_var(self, var: Any) -> None:
        """Keep `var`'s gradient on this rank (divided by the set size when `scale_local_gradients`)."""
        self._reducer.register_local_source(var)

    @property
    def _agg_helper(self) -> "AggregationView | None":
        """What Horovod's tests read of its aggregation helper (None without aggregation)."""
        return AggregationView(self) if self._passes_per_step > 1 else None

    def build(self, variables: Sequence[Any]) -> None:
        if not self._optimizer.built:
            self._optimizer.build(variables)
        if self._passes_per_step > 1 and not self._hvd_variables:
            accumulators = [self.add_variable_from_reference(v, name="hvd_aggregated") for v in variables]
            passes = self.add_variable(shape=(), dtype="int32", initializer="zeros", name="hvd_passes")
            self._hvd_variables = accumulators + [passes]
        super().build(variables)

    def scale_loss(self, loss: Any) -> Any:
        return self._optimizer.scale_loss(loss)

    def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
        self._optimizer.finalize_variable_values(var_list)

    # -- the step ---------------------------------------------------------------------------------------
    def apply_gradients(self, grads_and_vars: Any) -> Any:
        grads, variables = zip(*grads_and_vars)
        self.apply(grads, variables)
        return self.iterations

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> None:
        if not self.built:
            if trainable_variables is None:
                raise ValueError("the optimizer is not built yet: pass trainable_variables, or call "
                                 "optimizer.build(variables) first")
            with keras.name_scope(self.name):
                self.build(list(trainable_variables))
        variables = list(trainable_variables) if trainable_variables is not None else list(self._trainable_variables)
        grads = list(grads)
        if self._passes_per_step == 1:
            reduced = allreduce_gradients(self._reducer, grads, variables, self._sparse_as_dense)
            self._optimizer.apply(reduced, trainable_variables)
            return
        if is_traced_jax(grads):
            raise NotImplementedError(
                "backward_passes_per_step > 1 is not supported inside jax.jit (the JAX backend's default); "
                "compile the model with jit_compile=False, or use the wrapped optimizer's "
                "gradient_accumulation_steps instead")
        *accumulators, passes = self._hvd_variables
        mine = [accumulators[self._get_variable_index(v)] for v in variables]
        for acc, grad in zip(mine, grads):
            if grad is not None:
                acc.assign_add(ops.convert_to_tensor(dense_gradient(grad, self._sparse_as_dense)))
        passes.assign_add(1)

        def reduce_and_apply() -> None:
            reduced = allreduce_gradients(self._reducer, [None if g is None else acc.value for acc, g in
                                                          zip(mine, grads)], variables, self._sparse_as_dense)
            if self._average_aggregated:
                reduced = [None if g is None else g / self._passes_per_step for g in reduced]
            self._optimizer.apply(reduced, trainable_variables)
            for acc in mine:
                acc.assign(ops.zeros(acc.shape, acc.dtype))
            passes.assign(0)

        def count_pass() -> None:  # as Horovod (and Keras' own gradient accumulation), every pass counts
            self._optimizer.iterations.assign_add(1)

        boundary = ops.equal(passes, self._passes_per_step)
        known = static_bool(boundary)
        if known is None:  # a traced TensorFlow graph: every rank takes the same branch at run time
            ops.cond(boundary, reduce_and_apply, count_pass)
        else:
            (reduce_and_apply if known else count_pass)()

    # -- saving ------------------------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        config = {
            "name": self.name,
            "optimizer": keras.saving.serialize_keras_object(self._optimizer),
            "sparse_as_dense": self._sparse_as_dense,
            "gradient_predivide_factor": self._gradient_predivide_factor,
            "op": self._reducer.op,
            "backward_passes_per_step": self._passes_per_step,
            "average_aggregated_gradients": self._average_aggregated,
            "scale_local_gradients": self._reducer.scale_local_gradients,
        }
        if isinstance(self._reducer.groups, int):
            config["groups"] = self._reducer.groups
        compression = compression_name(self._reducer.compression)
        if compression:
            config["compression"] = compression
        return config

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> "DistributedOptimizer":
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        config["compression"] = getattr(Compression, config.get("compression", "none"))
        if config.get("op") not in OP_NAMES:
            config.pop("op", None)
        return cls(inner, **config)


class AggregationView:
    """Horovod's `optimizer._agg_helper`, as far as its users read it: `counter`, the passes summed
    since the last reduction, and `register_local_var`."""

    def __init__(self, optimizer: DistributedOptimizer) -> None:
        self._optimizer = optimizer
        self.backward_passes_per_step = optimizer._passes_per_step
        self.register_local_var = optimizer.register_local_var

    @property
    def counter(self) -> Any:
        """The pass counter (a variable); None until the optimizer is built."""
        return self._optimizer._hvd_variables[-1] if self._optimizer._hvd_variables else None


AGGREGATED_SPARSE = ("IndexedSlices are not supported when `backward_passes_per_step` > 1 and `sparse_as_dense` "
                     "is False.")


def dense_gradient(grad: Any, sparse_as_dense: bool) -> Any:
    """A gradient to add to a local sum: sparse ones only with `sparse_as_dense`, as Horovod says."""
    if type(grad).__name__ == "IndexedSlices" and not sparse_as_dense:
        raise ValueError(AGGREGATED_SPARSE)
    return grad


def keras2_reducer(optimizer: Any, name: str | None = None, compression: type[Compressor] = Compression.none,
                   gradient_predivide_factor: float = 1.0, op: int = Average, num_groups: int = 0, groups: Any = None,
                   process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True) -> GradientReducer:
    """How a Keras 2 optimizer's gradients are reduced."""
    return GradientReducer(name or f"Distributed{type(optimizer).__name__}", op, gradient_predivide_factor,
                           num_groups, groups, process_set, compression, scale_local_gradients)


def keras2_distributed(optimizer: Any, name: str | None = None, device_dense: str = "", device_sparse: str = "",
                       compression: type[Compressor] = Compression.none, sparse_as_dense: bool = False,
                       gradient_predivide_factor: float = 1.0, op: int = Average, backward_passes_per_step: int = 1,
                       average_aggregated_gradients: bool = False, num_groups: int = 0, groups: Any = None,
                       process_set: ProcessSet = global_process_set, scale_local_gradients: bool = True) -> Any:
    """DistributedOptimizer's options for a Keras 2 optimizer (`horovod._keras.keras2`)."""
    from horovod._keras import keras2  # TensorFlow's, imported only when tf_keras is in use

    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    reducer = keras2_reducer(optimizer, name, compression, gradient_predivide_factor, op, num_groups, groups,
                             process_set, scale_local_gradients)
    return keras2.wrap(optimizer, reducer, sparse_as_dense, int(backward_passes_per_step),
                       average_aggregated_gradients)


@functools.cache
def named_wrapper(optimizer_class: type) -> type[DistributedOptimizer]:
    """The wrapper class under `optimizer_class`'s name (see the module docstring)."""
    named = type(optimizer_class.__name__, (DistributedOptimizer,),
                 {"__module__": __name__, "__doc__": DistributedOptimizer.__doc__})
    # Saved under the wrapper's registered name; registering the wrapper again keeps that name
    # loading the wrapper itself, whose from_config picks the named class from the inner optimizer.
    register = keras.saving.register_keras_serializable(package="horovod", name=DistributedOptimizer.__name__)
    register(named)
    register(DistributedOptimizer)
    return named
