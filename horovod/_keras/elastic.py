"""Elastic training for Keras 3 (any backend): `KerasState` and the callbacks that keep it current.

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, initial_epoch=state.epoch, epochs=epochs, callbacks=callbacks)

The model's and the optimizer's variables are saved as numpy copies at `commit()`, assigned
back by `restore()`, and taken from rank 0 by `sync()`; other keyword arguments are kept as
`ObjectState` keeps them. The loop is `horovod.common.elastic`; see docs/elastic.md.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from horovod._keras.callbacks import Keras2Hooks, broadcast_keras_variables, optimizer_variables
from horovod._keras.optimizer import is_keras2_optimizer
from horovod.common import basics
from horovod.common import ops as core
from horovod.common.elastic import ObjectState, run


def _broadcast_object(obj: Any) -> Any:
    return core.broadcast_object(obj, 0)


class KerasState(ObjectState):
    """A Keras model (built), its optimizer (default: the compiled one) and plain attributes."""

    def __init__(self, model: keras.Model, optimizer: Any = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self._saved_weights: list[np.ndarray] = []
        super().__init__(_broadcast_object, basics.rank, **kwargs)
        self._save_weights()

    def _variables(self) -> list[Any]:
        """The model's variables and the optimizer's (built now if it was not yet, so every rank,
        a newcomer included, has the same list to sync)."""
        if is_keras2_optimizer(self.optimizer):  # tf_keras: no `built`; the legacy ones make slots lazily
            from horovod._keras.keras2 import build_optimizer_state

            build_optimizer_state(self.optimizer, self.model.trainable_variables)
        elif self.optimizer is not None and not self.optimizer.built:
            self.optimizer.build(self.model.trainable_variables)
        return list(self.model.variables) + optimizer_variables(self.optimizer)

    def _save_weights(self) -> None:
        self._saved_weights = [np.array(keras.ops.convert_to_numpy(v)) for v in self._variables()]

    def save(self) -> None:
        self._save_weights()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self._variables(), self._saved_weights):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        broadcast_keras_variables(self._variables(), 0, "KerasState.sync")
        self._save_weights()
        super().sync()


class CommitStateCallback(Keras2Hooks, keras.callbacks.Callback):
    """Commit the state every `batches_per_commit` batches and at the end of every epoch."""

    def __init__(self, state: KerasState, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(Keras2Hooks, keras.callbacks.Callback):
    """Keep `state.batch` = batches done in the current pass over the epoch. Keras 3 `fit` runs an
    epoch interrupted by a reset again from its first batch (it reads no shortened step count)."""

    def __init__(self, state: KerasState) -> None:
        super().__init__()
        self.state = state

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(Keras2Hooks, keras.callbacks.Callback):
    """Keep `state.epoch` = the next epoch to run (pass it to `fit(initial_epoch=...)`)."""

    def __init__(self, state: KerasState) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.state.epoch = epoch + 1


__all__ = ["CommitStateCallback", "KerasState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
