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


class _LegacyDistributedOptimizer(tf.compat.v1.train.Optimizer):
    """A `tf.compat.v1.train.Optimizer` whose `compute_gradients` returns reduced gradients; the
    rest is the wrapped optimizer's."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, reducer: GradientReducer, name: str,
                 use_locking: bool, sparse_as_dense: bool) -> None:
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer
        self._sparse_as_dense = sparse_as_dense

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = allreduce_gradients(self._reducer, [g for g, _ in pairs], [v for _, v in pairs], self._sparse_as_dense)
        return list(zip(grads, [v for _, v in pairs]))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

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

    A Keras 3 optimizer (`keras.optimizers.*`, which `tf.keras.optimizers` is on TF 2.16+) gets
    `horovod.tensorflow.keras.DistributedOptimizer`; a `tf.compat.v1.train.Optimizer` gets a
    wrapper whose `compute_gradients` reduces (`backward_passes_per_step` must be 1 there)."""
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        from horovod._keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer

        return KerasDistributedOptimizer(optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
                                         gradient_predivide_factor, op, backward_passes_per_step,
                                         average_aggregated_gradients, num_groups, groups, process_set,
                                         scale_local_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step != 1:
            raise NotImplementedError("backward_passes_per_step > 1 is supported for Keras optimizers only")
        name = name or f"Distributed{type(optimizer).__name__}"
        reducer = GradientReducer(name, op, gradient_predivide_factor, num_groups, groups, process_set, compression,
                                  scale_local_gradients)
        return _LegacyDistributedOptimizer(optimizer, reducer, name, use_locking, sparse_as_dense)
    raise ValueError(f"DistributedOptimizer wraps a Keras 3 optimizer or a tf.compat.v1.train.Optimizer, "
                     f"got {type(optimizer).__name__}")
