"""`TorchEstimator` / `TorchModel` for PyTorch Lightning: the module's own steps drive training.

The estimator runs `horovod.spark.torch`'s training loop (same data path, broadcast of rank 0's
weights, `hvd.DistributedOptimizer` averaging the gradients, checkpoint per epoch) with the
LightningModule's hooks in place of a loss function: `configure_optimizers()` gives the
optimizer (and an LR scheduler, stepped once per epoch), `training_step(batch, batch_idx)`
returns the loss (a tensor, or a dict with `"loss"`), `validation_step` (when the module defines
one) is run on the held-out rows. A batch is a dict of tensors by column name. What the steps
`self.log(name, value)` goes into the history, averaged over the epoch and the ranks.

No Lightning `Trainer` runs: its loop, callbacks, loggers and strategies are not used. The
parameters of Horovod's Lightning estimator that configure the Trainer (`trainer_args`, `logger`,
`callbacks`, ...) are taken and warn at fit time that they have no effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import cloudpickle

from horovod.spark.common.data import PreparedData
from horovod.spark.common.estimator import TrainResult
from horovod.spark.common.params import param
from horovod.spark.torch.estimator import TorchEstimator as _PlainTorchEstimator
from horovod.spark.torch.estimator import TorchModel as _PlainTorchModel
from horovod.spark.torch.estimator import TrainConfig, train


def _scalar(value: Any) -> float:
    return float(value.detach().item() if hasattr(value, "detach") else value)


def _loss_of(output: Any, hook: str) -> Any:
    if isinstance(output, dict) and "loss" in output:
        return output["loss"]
    if hasattr(output, "backward"):
        return output
    raise TypeError(f"{hook} must return the loss (a tensor) or a dict with 'loss', got {type(output).__name__}")


class _Logged:
    """Stands in for `LightningModule.log` while a step runs: collects what the step logs."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def __call__(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.values[name] = _scalar(value)


@dataclass(frozen=True)
class _LightningSteps:
    """The LightningModule's hooks as `horovod.spark.torch.estimator.Steps`."""

    def optimizer(self, model: Any) -> tuple[Any, Any]:
        configured = model.configure_optimizers()
        scheduler = None
        if isinstance(configured, dict):
            configured, scheduler = configured["optimizer"], configured.get("lr_scheduler")
        elif isinstance(configured, (list, tuple)) and len(configured) == 2 and isinstance(configured[0], list):
            configured, schedulers = configured
            scheduler = schedulers[0] if schedulers else None
        if isinstance(configured, (list, tuple)):
            if len(configured) != 1:
                raise NotImplementedError(f"configure_optimizers() returned {len(configured)} optimizers; "
                                          "horovod.spark.lightning trains with one")
            configured = configured[0]
        if isinstance(scheduler, dict):
            if scheduler.get("interval", "epoch") != "epoch":
                raise NotImplementedError("only LR schedulers stepped per epoch (interval 'epoch') are supported")
            scheduler = scheduler["scheduler"]
        return configured, scheduler

    terminate_on_nan: bool = False

    def train_step(self, model: Any, optimizer: Any, batch: dict[str, Any], index: int, last: bool
                   ) -> tuple[Any, dict[str, float]]:
        optimizer.zero_grad()
        with _logging(model) as logged:
            loss = _loss_of(model.training_step(batch, index), "training_step")
        if self.terminate_on_nan and not bool(loss.isfinite()):
            raise ValueError(f"training_step returned a loss of {loss.item()} at batch {index} (terminate_on_nan=True)")
        loss.backward()
        optimizer.step()
        return loss, logged.values

    def val_step(self, model: Any, batch: dict[str, Any], index: int) -> dict[str, float]:
        if type(model).validation_step is _base_validation_step():
            return {}
        with _logging(model) as logged:
            output = model.validation_step(batch, index)
        values = dict(logged.values)
        if output is not None and "val_loss" not in values:
            values["val_loss"] = _scalar(_loss_of(output, "validation_step"))
        return values


def _base_validation_step() -> Any:
    import lightning.pytorch as pl

    return pl.LightningModule.validation_step


class _logging:
    """`with _logging(model) as logged:` routes `model.log(...)` into `logged` for one step."""

    def __init__(self, model: Any) -> None:
        self.model, self.logged = model, _Logged()

    def __enter__(self) -> _Logged:
        self.model.log = self.logged  # an instance attribute shadows the method
        return self.logged

    def __exit__(self, *exc: object) -> None:
        del self.model.log


#: The oldest Lightning this estimator runs with.
MIN_PL_VERSION = "2.0.0"

_NO_TRAINER = "the estimator runs its own loop over the module's hooks, not Lightning's Trainer"


class TorchEstimator(_PlainTorchEstimator):
    """Fits a `lightning.pytorch.LightningModule` on a DataFrame with Horovod; `fit(df)` returns a
    `TorchModel`. The module's `configure_optimizers` and `training_step` (and `validation_step`)
    define training; `optimizer` and `loss` are not used."""

    num_gpus = param("num_gpus", "GPUs per process (default 1 when CUDA is available, else 0)")
    logger = param("logger", "a Lightning logger")
    log_every_n_steps = param("log_every_n_steps", "how often the Trainer logs")
    loader_num_epochs = param("loader_num_epochs", "passes the data loader makes (None: as many as needed)")
    terminate_on_nan = param("terminate_on_nan", "stop training on a loss that is NaN or infinite")
    profiler = param("profiler", "a Lightning profiler")
    trainer_args = param("trainer_args", "keyword arguments for Lightning's Trainer, over the estimator's")
    debug_data_loader = param("debug_data_loader", "debug output of the data loader")
    train_async_data_loader_queue_size = param("train_async_data_loader_queue_size", "batches read ahead (training)")
    val_async_data_loader_queue_size = param("val_async_data_loader_queue_size", "batches read ahead (validation)")

    _unsupported = ("optimizer", "loss", "metrics")
    _DEFAULTS = {**_PlainTorchEstimator._DEFAULTS, "num_gpus": None, "logger": None, "log_every_n_steps": 50,
                 "loader_num_epochs": None, "terminate_on_nan": False, "profiler": None, "trainer_args": None,
                 "debug_data_loader": False, "train_async_data_loader_queue_size": None,
                 "val_async_data_loader_queue_size": None}
    _not_honoured = {**_PlainTorchEstimator._not_honoured, "train_minibatch_fn": _NO_TRAINER,
                     "backward_passes_per_step": _NO_TRAINER, "loss_constructors": _NO_TRAINER,
                     "loss_weights": _NO_TRAINER, "callbacks": _NO_TRAINER,
                     **{name: _NO_TRAINER for name in ("num_gpus", "logger", "log_every_n_steps", "loader_num_epochs",
                                                       "profiler", "trainer_args", "debug_data_loader",
                                                       "train_async_data_loader_queue_size",
                                                       "val_async_data_loader_queue_size")}}

    def __init__(self, **kwargs: Any) -> None:
        import lightning.pytorch as pl
        from packaging.version import Version

        if Version(pl.__version__) < Version(MIN_PL_VERSION):
            raise RuntimeError(f"Only support pytorch_lightning version > {MIN_PL_VERSION}, found version {pl.__version__}")
        super().__init__(**kwargs)

    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        import lightning.pytorch as pl

        model = self._required("model")
        if not isinstance(model, pl.LightningModule):
            raise TypeError(f"model= must be a lightning.pytorch.LightningModule, got {type(model).__name__}")
        config = TrainConfig(cloudpickle.dumps(model), _LightningSteps(bool(self.getOrDefault("terminate_on_nan"))),
                             self.getOrDefault("gradient_compression"), self.plan(data, run_id, num_proc),
                             resume_from=self._resume_from(run_id))
        return lambda: train(config)

    def _model_class(self) -> type["TorchModel"]:
        return TorchModel


class TorchModel(_PlainTorchModel):
    """A trained LightningModule as a Spark ML transformer: `transform(df)` adds what its
    `forward(*features)` predicts; saves and loads like `horovod.spark.torch.TorchModel`."""
