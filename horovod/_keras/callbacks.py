"""Keras 3 callbacks for data-parallel training, on every backend (callbacks run eagerly, so
values travel as numpy arrays through the core). `horovod.keras.callbacks` and
`horovod.tensorflow.keras.callbacks` both export these classes."""

from __future__ import annotations

from typing import Any, Callable

import keras
import numpy as np

from horovod._keras.optimizer import DistributedOptimizer
from horovod.common import basics
from horovod.common import ops as core


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer state every rank must share (a DistributedOptimizer's own aggregation
    buffers hold this rank's gradients and stay local). Keras 2's legacy optimizers have a
    `variables()` method."""
    if isinstance(optimizer, DistributedOptimizer):
        optimizer = optimizer.inner_optimizer
    if optimizer is None:
        return []
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


class Keras2Hooks:
    """What Keras 2's (tf_keras) CallbackList asks of a callback beyond Keras 3's interface, so the
    same callbacks serve `model.fit` of both Keras versions."""

    _supports_tf_logs = False

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False


def broadcast_keras_variables(variables: list[Any], root_rank: int, prefix: str) -> None:
    """Overwrite Keras variables with the root's values, all broadcasts in one round."""
    handles = [core.broadcast_async(np.asarray(keras.ops.convert_to_numpy(v), order="C"), root_rank,
                                       f"{prefix}.{i}")
               for i, v in enumerate(variables)]
    for var, handle in zip(variables, handles):
        var.assign(handle.wait())


class BroadcastGlobalVariablesCallback(Keras2Hooks, keras.callbacks.Callback):
    """Make every rank start from the root's weights: broadcasts the model's and the optimizer's
    variables once, at the end of the first batch (when the optimizer's slots exist).

    `local_variables` are left alone; `device` is accepted for compatibility."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        locals_ = [] if local_variables is None else local_variables
        self._local_ids = {id(v) for v in (locals_ if isinstance(locals_, (list, tuple)) else [locals_])}
        self.broadcast_done = False

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.broadcast_done:
            return
        variables = list(self.model.variables) + optimizer_variables(getattr(self.model, "optimizer", None))
        variables = [v for v in variables if id(v) not in self._local_ids]
        broadcast_keras_variables(variables, self.root_rank, "BroadcastGlobalVariablesCallback")
        self.broadcast_done = True


class MetricAverageCallback(Keras2Hooks, keras.callbacks.Callback):
    """At the end of every epoch, replace each metric in `logs` by its average over all ranks
    (in sorted name order), so callbacks placed after it see global values."""

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if not logs:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        handles = [core.allreduce_async(np.asarray([logs[k]], np.float64), f"MetricAverageCallback.{k}")
                   for k in names]
        for name, handle in zip(names, handles):
            logs[name] = float(handle.wait()[0])


def _get_lr(optimizer: Any) -> float:
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class LearningRateScheduleCallback(Keras2Hooks, keras.callbacks.Callback):
    """lr = initial_lr * multiplier(epoch) for start_epoch <= epoch < end_epoch.

    `multiplier` is a function of the epoch, or a constant m meaning m ** (epoch - start_epoch).
    With `staircase` the rate changes at the first batch of each epoch; otherwise every batch,
    with the epoch counted fractionally (needs `steps_per_epoch`, found from `fit` when None).
    With `momentum_correction`, an SGD momentum buffer is rescaled by new_lr / old_lr when the
    rate changes (as if the momentum were scaled for that one batch). Adds `lr` to the epoch logs.
    """

    def __init__(self, initial_lr: float | None, multiplier: float | Callable[[float], float], start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: int | None = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: multiplier ** (epoch - start_epoch)

    def _autodetect_steps_per_epoch(self) -> int:
        params = self.params or {}
        if params.get("steps"):
            return int(params["steps"])
        if params.get("samples") and params.get("batch_size"):
            return int(params["samples"]) // int(params["batch_size"])
        raise ValueError(f"{type(self).__name__} cannot tell how many steps an epoch has (the dataset has no "
                         "known length); pass steps_per_epoch=")

    def _in_range(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        buffers = getattr(optimizer, "momentums", None)
        if self.momentum_correction and getattr(optimizer, "momentum", 0) and buffers and old_lr and new_lr != old_lr:
            for buffer in buffers:
                buffer.assign(buffer * (new_lr / old_lr))

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.current_epoch = epoch

    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.current_epoch is None or not self._in_range(self.current_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the rate from initial_lr / size to initial_lr over `warmup_epochs` (linear in the
    fractional epoch, Goyal et al. 2017): large global batches train stably from the start."""

    def __init__(self, initial_lr: float | None, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            size = basics.size()
            return (epoch * (size - 1) / warmup_epochs + 1) / size

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            print(f"\nEpoch {epoch + 1}: learning rate warmup complete, lr = {_get_lr(self.model.optimizer):g}.")


class BestModelCheckpoint(Keras2Hooks, keras.callbacks.ModelCheckpoint):
    """ModelCheckpoint that keeps only the best model (`save_best_only=True`). `filepath` may be
    set later (Horovod's Spark estimator does); it must be set before training starts."""

    def __init__(self, monitor: str = "val_loss", verbose: int = 0, save_weights_only: bool = False,
                 mode: str = "auto", save_freq: str | int = "epoch", filepath: str | None = None) -> None:
        placeholder = "unset.weights.h5" if save_weights_only else "unset.keras"
        super().__init__(filepath=filepath or placeholder, monitor=monitor, verbose=verbose, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.filepath is None:
            raise ValueError("BestModelCheckpoint.filepath is not set; assign it before calling fit()")
        super().on_train_begin(logs)
