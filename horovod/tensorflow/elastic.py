"""Elastic training for TensorFlow 2: `run`, `TensorFlowKerasState`, `TensorFlowState`.

`TensorFlowKerasState` is the Keras state (`horovod._keras.elastic.KerasState`); `backend` is
accepted for compatibility. `TensorFlowState` keeps a list of `tf.Variable`s. The loop is
`horovod.common.elastic`, which also recognises our failures re-raised by TensorFlow from inside
a `tf.function`. See docs/elastic.md.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from horovod._keras.elastic import KerasState
from horovod.common import basics
from horovod.common.elastic import ObjectState, run
from horovod.tensorflow.functions import broadcast_object, broadcast_variables

__all__ = ["TensorFlowKerasState", "TensorFlowState", "run"]


class TensorFlowKerasState(KerasState):
    """`TensorFlowKerasState(model, optimizer=None, backend=None, **kwargs)`: a built Keras model and its optimizer."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer, **kwargs)


class TensorFlowState(ObjectState):
    """`TensorFlowState(variables=None, session=None, **kwargs)`: `tf.Variable`s (default: every
    trainable variable of TF1 graph mode) and plain attributes. `session` is for TF1 graphs only."""

    def __init__(self, variables: Sequence[tf.Variable] | None = None, session: Any = None, **kwargs: Any) -> None:
        if session is not None and tf.executing_eagerly():
            raise ValueError("TensorFlowState(session=...) is for TF1 graph mode; in TF2 pass the variables")
        self.variables = list(variables) if variables is not None else tf.compat.v1.trainable_variables()
        self._saved_values = [v.numpy() for v in self.variables]
        super().__init__(lambda obj: broadcast_object(obj, 0), basics.rank, **kwargs)

    def save(self) -> None:
        self._saved_values = [v.numpy() for v in self.variables]
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._saved_values):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        if self.variables:
            broadcast_variables(self.variables, root_rank=0)
            self._saved_values = [v.numpy() for v in self.variables]
        super().sync()
