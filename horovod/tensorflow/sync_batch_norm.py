"""Batch normalization whose batch statistics cover the global batch (all ranks)."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Sum
from horovod.tensorflow._bridge import set_size
from horovod.tensorflow.mpi_ops import grouped_allreduce


@keras.saving.register_keras_serializable(package="horovod")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` (TensorFlow backend) whose training-mode mean and
    variance are those of the samples of every rank together: each rank sums its inputs, their
    squares and its sample count, and one allreduce combines them. Gradients flow through the
    allreduce, so N ranks on shards train exactly like one process on the whole batch.

    Inference, and a single rank, behave like the plain layer. `fused` is accepted for
    compatibility and must not be True."""

    def __init__(self, fused: bool | None = None, process_set: ProcessSet = global_process_set, **kwargs: Any) -> None:
        if fused:
            raise ValueError("SyncBatchNormalization does not support fused=True")
        super().__init__(**kwargs)
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if set_size(self.process_set) == 1:
            return super()._moments(inputs, mask)
        x = tf.convert_to_tensor(inputs)
        axes = list(self._reduction_axes)
        if mask is None:
            weights = tf.ones_like(x)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
        count = tf.reduce_sum(weights, axes)
        total = tf.reduce_sum(x * weights, axes)
        squares = tf.reduce_sum(tf.square(x) * weights, axes)
        count, total, squares = grouped_allreduce([count, total, squares], op=Sum, process_set=self.process_set)
        mean = total / count
        return mean, tf.maximum(squares / count - tf.square(mean), 0.0)
