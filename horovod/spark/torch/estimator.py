"""`TorchEstimator` / `TorchModel`: the PyTorch half of the Spark estimators.

Every rank rebuilds the model and the optimizer from what the driver sent, takes rank 0's
weights (`broadcast_parameters`, `broadcast_optimizer_state`), trains on its own share of the
Parquet rows with `hvd.DistributedOptimizer`, and rank 0 checkpoints into the store after every
epoch (`torch.save` of the model's and optimizer's state, and the epoch). The model is called as
`model(*features)`, one tensor per feature column; `loss(outputs, labels)` with a float label
reshaped to the output's shape when they hold as many values (a (B,) column against a (B, 1)
output), so a plain `mse_loss` works.

The loop (`train`) is shared with `horovod.spark.lightning`: what differs between the two is a
`Steps` object (how the optimizer is built, what one training and one validation batch compute).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import cloudpickle
import numpy as np

from horovod.spark.common.data import PreparedData, epoch_batches, read_shard
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, TrainingPlan, TrainResult


class Steps(Protocol):
    """What one kind of estimator computes inside the shared training loop (`train`): this
    module's for a plain `nn.Module`, `horovod.spark.lightning`'s for a LightningModule."""

    def optimizer(self, model: Any) -> tuple[Any, Any]:
        """The optimizer for this rank's `model`, and an LR scheduler stepped per epoch (or None)."""

    def train_step(self, model: Any, batch: dict[str, Any], index: int) -> tuple[Any, dict[str, float]]:
        """The loss to back-propagate for one batch (by column), and metrics to average per epoch."""

    def val_step(self, model: Any, batch: dict[str, Any], index: int) -> dict[str, float]:
        """Validation values of one batch (averaged per epoch, e.g. `val_loss`)."""


@dataclass(frozen=True)
class TrainConfig:
    """What a PyTorch rank needs: the model, the estimator's `Steps`, the compression, the plan."""

    model: bytes
    steps: Steps
    compression: Any
    plan: TrainingPlan


@dataclass(frozen=True)
class _ModuleSteps:
    """`TorchEstimator`'s steps: `loss(model(*features), labels)`, metrics on the outputs."""

    optimizer_cls: type
    optimizer_defaults: dict[str, Any]
    optimizer_state: dict[str, Any]
    loss: Any
    metrics: Sequence[Callable[..., Any]]
    feature_cols: Sequence[str]
    label_cols: Sequence[str]

    def optimizer(self, model: Any) -> tuple[Any, Any]:
        optimizer = self.optimizer_cls(model.parameters(), **self.optimizer_defaults)
        optimizer.load_state_dict(self.optimizer_state)
        return optimizer, None

    def train_step(self, model: Any, batch: dict[str, Any], index: int) -> tuple[Any, dict[str, float]]:
        labels = [batch[col] for col in self.label_cols]
        outputs = model(*(batch[col] for col in self.feature_cols))
        return _loss(self.loss, outputs, labels), {m.__name__: float(m(outputs, labels[0])) for m in self.metrics}

    def val_step(self, model: Any, batch: dict[str, Any], index: int) -> dict[str, float]:
        outputs = model(*(batch[col] for col in self.feature_cols))
        return {"val_loss": _loss(self.loss, outputs, [batch[col] for col in self.label_cols]).item()}


def _loss(loss: Any, outputs: Any, labels: list[Any]) -> Any:
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    losses = loss if isinstance(loss, (list, tuple)) else [loss] * len(outputs)
    total = 0
    for fn, output, label in zip(losses, outputs, labels):
        if label.is_floating_point() and label.numel() == output.numel():
            label = label.view_as(output)
        total = total + fn(output, label)
    return total


def _batch(torch: Any, arrays: dict[str, np.ndarray], index: np.ndarray) -> dict[str, Any]:
    return {col: torch.as_tensor(values[index]) for col, values in arrays.items()}


def _epoch_means(hvd: Any, sums: dict[str, float], steps: int) -> dict[str, float]:
    """Each value's mean over the epoch's steps and the ranks (gathered as objects: a value one
    rank never produced cannot leave the others waiting in a collective)."""
    gathered = hvd.allgather_object(sums)
    names = sorted({name for rank_sums in gathered for name in rank_sums})
    return {name: sum(s.get(name, 0.0) for s in gathered) / (steps * len(gathered)) for name in names}


def train(config: TrainConfig) -> TrainResult | None:
    """One rank's training; rank 0 returns the history, the trained model and its output shapes."""
    import torch

    import horovod.torch as hvd

    plan, steps = config.plan, config.steps
    hvd.init()
    try:
        if plan.seed is not None:
            torch.manual_seed(plan.seed)
        model = cloudpickle.loads(config.model)
        optimizer, scheduler = steps.optimizer(model)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=config.compression or hvd.Compression.none)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        columns = list(dict.fromkeys([*plan.feature_cols, *plan.label_cols]))
        train_rows = read_shard(plan.store, plan.data.train_path, columns, hvd.rank(), hvd.size())
        val_rows = (read_shard(plan.store, plan.data.val_path, columns, hvd.rank(), hvd.size())
                    if plan.data.val_path and plan.steps[1] else None)
        rng = np.random.default_rng(None if plan.seed is None else plan.seed + hvd.rank())
        history: dict[str, list[float]] = {}
        for epoch in range(plan.epochs):
            model.train()
            sums: dict[str, float] = {}
            rows = len(train_rows[plan.feature_cols[0]])
            for i, index in enumerate(epoch_batches(rows, plan.batch_size, plan.steps[0], plan.shuffle, rng)):
                optimizer.zero_grad()
                loss, metrics = steps.train_step(model, _batch(torch, train_rows, index), i)
                loss.backward()
                optimizer.step()
                for name, value in {"loss": loss.item(), **metrics}.items():
                    sums[name] = sums.get(name, 0.0) + value
            means = _epoch_means(hvd, sums, plan.steps[0])
            if val_rows is not None:
                model.eval()
                val_sums: dict[str, float] = {}
                count = len(val_rows[plan.feature_cols[0]])
                with torch.no_grad():
                    for i, index in enumerate(epoch_batches(count, plan.val_batch_size, plan.steps[1], False, rng)):
                        for name, value in steps.val_step(model, _batch(torch, val_rows, index), i).items():
                            val_sums[name] = val_sums.get(name, 0.0) + value
                means.update(_epoch_means(hvd, val_sums, plan.steps[1]))
            if scheduler is not None:
                scheduler.step()
            for name, value in means.items():
                history.setdefault(name, []).append(value)
            if hvd.rank() == 0:
                buffer = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, buffer)
                plan.store.write(plan.store.get_checkpoint_path(plan.run_id), buffer.getvalue())
                if plan.verbose:
                    print(f"epoch {epoch + 1}/{plan.epochs}: " +
                          ", ".join(f"{k}={v[-1]:.4f}" for k, v in history.items()), flush=True)
        if hvd.rank() != 0:
            return None
        model.eval()
        with torch.no_grad():
            outputs = model(*(torch.as_tensor(train_rows[col][:1]) for col in plan.feature_cols))
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        return {"history": history, "model": cloudpickle.dumps(model),
                "output_shapes": [tuple(output.shape[1:]) for output in outputs]}
    finally:
        hvd.shutdown()


class TorchEstimator(HorovodEstimator):
    """Fits a `torch.nn.Module` on a DataFrame with Horovod; `fit(df)` returns a `TorchModel`.

    `optimizer` is an optimizer built on `model.parameters()`; each rank builds one like it (same
    class, settings and state) on its own copy of the model. `loss` is a callable
    `loss(outputs, labels)` (or one per output); `metrics` callables `metric(outputs, labels)`.
    """

    _unsupported = ("callbacks",)

    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        optimizer = self._required("optimizer")
        steps = _ModuleSteps(
            optimizer_cls=type(optimizer), optimizer_defaults=dict(optimizer.defaults),
            optimizer_state=optimizer.state_dict(), loss=self._required("loss"),
            metrics=list(self.getOrDefault("metrics") or []), feature_cols=list(self.getOrDefault("feature_cols")),
            label_cols=list(self.getOrDefault("label_cols")))
        config = TrainConfig(cloudpickle.dumps(self.getOrDefault("model")), steps,
                             self.getOrDefault("gradient_compression"), self.plan(data, run_id, num_proc))
        return lambda: train(config)

    def _model_class(self) -> type["TorchModel"]:
        return TorchModel

    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "TorchModel":
        return self._model_class()(history=result["history"], model=cloudpickle.loads(result["model"]),
                          feature_columns=list(self.getOrDefault("feature_cols")),
                          label_columns=list(self.getOrDefault("label_cols")), run_id=run_id,
                          _metadata={"output_shapes": result["output_shapes"], "shapes": data.shapes})


class TorchModel(HorovodModel):
    """A trained PyTorch model as a Spark ML transformer: `transform(df)` adds the predictions."""

    def _predict_fn(self) -> Callable[[list[Any]], list[Any]]:
        payload = cloudpickle.dumps(self.getOrDefault("model"))
        loaded: list[Any] = []

        def predict(inputs: list[Any]) -> list[Any]:
            import torch

            if not loaded:
                loaded.append(cloudpickle.loads(payload).eval())
            with torch.no_grad():
                outputs = loaded[0](*[torch.as_tensor(array) for array in inputs])
            outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
            return [output.numpy() for output in outputs]

        return predict

    def model_bytes(self) -> bytes:
        return cloudpickle.dumps(self.getOrDefault("model"))

    @classmethod
    def from_model_bytes(cls, data: bytes) -> Any:
        return cloudpickle.loads(data)
