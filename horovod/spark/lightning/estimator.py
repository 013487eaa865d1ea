"""`TorchEstimator` / `TorchModel` for PyTorch Lightning: Lightning's own `Trainer` trains the module.

Each rank runs `lightning.pytorch.Trainer` (or `pytorch_lightning.Trainer`, whichever package the
module's `LightningModule` comes from) with a strategy whose data parallelism is `horovod.torch`
(`horovod.spark.lightning.strategy`), on its share of the rows the estimator wrote to the store
(`horovod.spark.lightning.remote`). So `trainer_args`, `logger`, `callbacks`, `profiler`,
checkpoints, `data_module` and modules with several optimizers behave as Lightning makes them.
The fitted `TorchModel` holds the trained module (the best checkpoint's when a `ModelCheckpoint`
was given) and `trainer.logged_metrics` as its history, as Horovod's does. A plain
`torch.nn.Module` with `optimizer=` and `loss=` trains the same way, wrapped (`legacy`).
"""

from __future__ import annotations

import copy
import io
import warnings
from typing import Any, Callable

import cloudpickle

from horovod.spark.common.data import PreparedData
from horovod.spark.common.estimator import TrainResult
from horovod.spark.common.params import param
from horovod.spark.lightning.legacy import WRAPPED, to_lightning_module
from horovod.spark.lightning.remote import LightningConfig, train
from horovod.spark.lightning.strategy import lightning_package
from horovod.spark.torch.estimator import TorchEstimator as _PlainTorchEstimator
from horovod.spark.torch.estimator import TorchModel as _PlainTorchModel

#: The oldest Lightning (`lightning` or `pytorch_lightning`) this estimator runs with.
MIN_PL_VERSION = "2.1.0"

_MODULE_HOOKS = "a LightningModule's own hooks (training_step, configure_optimizers, self.log) define it"


def _check_version(package: str) -> None:
    import importlib

    from packaging.version import Version

    version = importlib.import_module(package).__version__
    if Version(version) < Version(MIN_PL_VERSION):
        raise RuntimeError(f"Only support pytorch_lightning version > {MIN_PL_VERSION}, found version {version}")


class TorchEstimator(_PlainTorchEstimator):
    """Fits a `LightningModule` on a DataFrame with Horovod and Lightning's `Trainer`; `fit(df)`
    returns a `TorchModel`. The module's `configure_optimizers`, `training_step` and
    `validation_step` define training; a batch is a dict of tensors by column name."""

    num_gpus = param("num_gpus", "GPUs per process (default 1 when CUDA is available, else 0)")
    logger = param("logger", "a Lightning logger (default: TensorBoardLogger under the run's logs/)")
    log_every_n_steps = param("log_every_n_steps", "how often the Trainer logs")
    loader_num_epochs = param("loader_num_epochs", "passes the data loader makes (None: as many as needed)")
    terminate_on_nan = param("terminate_on_nan", "stop training on a loss or weight that is NaN or infinite")
    profiler = param("profiler", "a Lightning profiler, or its name ('simple', 'advanced')")
    trainer_args = param("trainer_args", "keyword arguments for Lightning's Trainer, over the estimator's")
    debug_data_loader = param("debug_data_loader", "print the data loaders' settings (rank 0)")
    train_async_data_loader_queue_size = param("train_async_data_loader_queue_size",
                                               "training batches a thread prepares ahead")
    val_async_data_loader_queue_size = param("val_async_data_loader_queue_size",
                                             "validation batches a thread prepares ahead")

    _DEFAULTS = {**_PlainTorchEstimator._DEFAULTS, "num_gpus": None, "logger": None, "log_every_n_steps": 50,
                 "loader_num_epochs": None, "terminate_on_nan": False, "profiler": None, "trainer_args": None,
                 "debug_data_loader": False, "train_async_data_loader_queue_size": None,
                 "val_async_data_loader_queue_size": None}
    _not_honoured = {**{name: reason for name, reason in _PlainTorchEstimator._not_honoured.items()
                        if name != "data_module"},
                     "train_minibatch_fn": _MODULE_HOOKS, "metrics": _MODULE_HOOKS}

    def __init__(self, **kwargs: Any) -> None:
        package = lightning_package(kwargs.get("model"))
        _check_version(package or "lightning.pytorch")
        super().__init__(**kwargs)

    def _lightning_module(self) -> tuple[Any, str | None]:
        """The model and its Lightning package (None: a plain `torch.nn.Module`, which trains
        wrapped in a LightningModule, Horovod's legacy form); Horovod's errors for what a
        LightningModule's hooks replace."""
        import torch

        model = self._required("model")
        package = lightning_package(model)
        if package is None:
            if not isinstance(model, torch.nn.Module):
                raise TypeError("model= must be a LightningModule (lightning.pytorch or pytorch_lightning), or a "
                                f"torch.nn.Module with optimizer= and loss=; got {type(model).__name__}")
            self._required("optimizer")
            if not self.getOrDefault("loss") and not self.getOrDefault("loss_constructors"):
                raise ValueError(f"{type(self).__name__}: a torch.nn.Module (not a LightningModule) needs loss= "
                                 "or loss_constructors=")
            _check_version("lightning.pytorch")
            return model, None
        _check_version(package)
        for name, hook in (("optimizer", "configure_optimizers"), ("loss", "training_step"),
                           ("loss_weights", "training_step")):
            if self.getOrDefault(name):
                raise ValueError(f"Parameter `{name}` cannot be specified with a `LightningModule`. "
                                 f"Implement `LightningModule.{hook}` instead.")
        if self.getOrDefault("loss_constructors"):
            warnings.warn(f"{type(self).__name__}: loss_constructors= has no effect here: {_MODULE_HOOKS}",
                          UserWarning, stacklevel=4)
        num_gpus = self.getOrDefault("num_gpus")
        if num_gpus is not None and int(num_gpus) > 1:
            warnings.warn(f"{type(self).__name__}: num_gpus={num_gpus}: each rank trains on one GPU (its own); "
                          "give more ranks to use more GPUs", UserWarning, stacklevel=4)
        return model, package

    def _fit(self, df: Any) -> Any:
        self._lightning_module()  # before the data is written
        return super()._fit(df)

    def _resume_from(self, run_id: str) -> bytes | None:
        """The run's last Lightning checkpoint (`*.ckpt`), when it has one: the fit resumes from it."""
        store = self.getOrDefault("store")
        checkpoints = store.get_checkpoints(run_id, suffix=".ckpt")
        if not checkpoints:
            return None
        if self.getOrDefault("verbose"):
            print(f"Resuming training from last checkpoint: {checkpoints[-1]}", flush=True)
        return store.read(checkpoints[-1])

    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        model, package = self._lightning_module()
        plan = self.plan(data, run_id, num_proc)
        if package is None:
            model, package = to_lightning_module(model, self.module_steps(plan)), "lightning.pytorch"
        payload = cloudpickle.dumps((model, self.getOrDefault("logger"), self.getOrDefault("profiler"),
                                     self.getOrDefault("data_module")))
        num_gpus = self.getOrDefault("num_gpus")
        loader_epochs = self.getOrDefault("loader_num_epochs")
        config = LightningConfig(
            package=package, payload=payload, plan=plan, compression=self.getOrDefault("gradient_compression"),
            num_gpus=None if num_gpus is None else int(num_gpus),
            log_every_n_steps=int(self.getOrDefault("log_every_n_steps")),
            terminate_on_nan=bool(self.getOrDefault("terminate_on_nan")),
            accumulate_grad_batches=int(self.getOrDefault("backward_passes_per_step")),
            trainer_args=dict(self.getOrDefault("trainer_args") or {}),
            loader_num_epochs=None if loader_epochs is None else int(loader_epochs),
            train_queue_size=self.getOrDefault("train_async_data_loader_queue_size"),
            val_queue_size=self.getOrDefault("val_async_data_loader_queue_size"),
            debug_data_loader=bool(self.getOrDefault("debug_data_loader")), resume_from=self._resume_from(run_id))
        return lambda: train(config)

    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "TorchModel":
        import torch

        model = copy.deepcopy(self.getOrDefault("model"))
        state = torch.load(io.BytesIO(result["state_dict"]), map_location="cpu", weights_only=False)
        if lightning_package(model) is None:  # the legacy wrapper's weights: the module's, prefixed
            state = {name[len(WRAPPED) + 1:]: value for name, value in state.items()}
        model.load_state_dict(state)
        model.eval()
        return TorchModel(history=result["history"], model=model,
                          feature_columns=list(self.getOrDefault("feature_cols")),
                          label_columns=list(self.getOrDefault("label_cols")), run_id=run_id,
                          _metadata={**self._model_metadata(result, data),
                                     "input_shapes": self.getOrDefault("input_shapes")})


class TorchModel(_PlainTorchModel):
    """A trained LightningModule as a Spark ML transformer: `transform(df)` adds what its
    `forward(*features)` predicts; saves and loads like `horovod.spark.torch.TorchModel`."""
