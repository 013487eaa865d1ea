"""`TorchEstimator` / `TorchModel`: the PyTorch half of the Spark estimators.

Every rank rebuilds the model and the optimizer from what the driver sent, takes rank 0's
weights (`broadcast_parameters`, `broadcast_optimizer_state`), trains on its own share of the
Parquet rows with `hvd.DistributedOptimizer`, and rank 0 checkpoints into the store after every
epoch (`torch.save` of the model's and optimizer's state, and the epoch). The model is called as
`model(*features)`, one tensor per feature column; `loss(outputs, labels)` with a float label
reshaped to the output's shape when they hold as many values (a (B,) column against a (B, 1)
output), so a plain `mse_loss` works.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import cloudpickle
import numpy as np

from horovod.spark.common.data import PreparedData, epoch_batches, read_shard
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, TrainingPlan, TrainResult


@dataclass(frozen=True)
class _TrainConfig:
    """What a PyTorch rank needs besides the plan."""

    model: bytes
    optimizer_cls: type
    optimizer_defaults: dict[str, Any]
    optimizer_state: dict[str, Any]
    loss: Any
    metrics: Sequence[Callable[..., Any]]
    compression: Any
    plan: TrainingPlan


def _loss(loss: Any, outputs: Any, labels: list[Any]) -> Any:
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    losses = loss if isinstance(loss, (list, tuple)) else [loss] * len(outputs)
    total = 0
    for fn, output, label in zip(losses, outputs, labels):
        if label.is_floating_point() and label.numel() == output.numel():
            label = label.view_as(output)
        total = total + fn(output, label)
    return total


def _batches(torch: Any, arrays: dict[str, np.ndarray], cols: Sequence[str], index: np.ndarray) -> list[Any]:
    return [torch.as_tensor(arrays[col][index]) for col in cols]


def _train(config: _TrainConfig) -> TrainResult | None:
    """One rank's training; rank 0 returns the history, the trained model and its output shapes."""
    import torch

    import horovod.torch as hvd

    plan = config.plan
    hvd.init()
    try:
        if plan.seed is not None:
            torch.manual_seed(plan.seed)
        model = cloudpickle.loads(config.model)
        optimizer = config.optimizer_cls(model.parameters(), **config.optimizer_defaults)
        optimizer.load_state_dict(config.optimizer_state)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=config.compression or hvd.Compression.none)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        columns = [*plan.feature_cols, *plan.label_cols]
        train = read_shard(plan.store, plan.data.train_path, columns, hvd.rank(), hvd.size())
        val = (read_shard(plan.store, plan.data.val_path, columns, hvd.rank(), hvd.size())
               if plan.data.val_path and plan.steps[1] else None)
        rng = np.random.default_rng(None if plan.seed is None else plan.seed + hvd.rank())
        history: dict[str, list[float]] = {}

        def record(name: str, value: float) -> None:
            history.setdefault(name, []).append(hvd.allreduce(torch.tensor(value), name=name).item())

        for epoch in range(plan.epochs):
            model.train()
            totals = np.zeros(1 + len(config.metrics))
            rows = len(train[plan.feature_cols[0]])
            for index in epoch_batches(rows, plan.batch_size, plan.steps[0], plan.shuffle, rng):
                optimizer.zero_grad()
                labels = _batches(torch, train, plan.label_cols, index)
                outputs = model(*_batches(torch, train, plan.feature_cols, index))
                loss = _loss(config.loss, outputs, labels)
                loss.backward()
                optimizer.step()
                totals += [loss.item(), *(float(m(outputs, labels[0])) for m in config.metrics)]
            for name, total in zip(["loss", *(m.__name__ for m in config.metrics)], totals):
                record(name, total / plan.steps[0])
            if val is not None:
                model.eval()
                val_total, val_rows = 0.0, len(val[plan.feature_cols[0]])
                with torch.no_grad():
                    for index in epoch_batches(val_rows, plan.val_batch_size, plan.steps[1], False, rng):
                        outputs = model(*_batches(torch, val, plan.feature_cols, index))
                        val_total += _loss(config.loss, outputs, _batches(torch, val, plan.label_cols, index)).item()
                record("val_loss", val_total / plan.steps[1])
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
            outputs = model(*_batches(torch, train, plan.feature_cols, np.arange(1)))
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
        config = _TrainConfig(
            model=cloudpickle.dumps(self.getOrDefault("model")), optimizer_cls=type(optimizer),
            optimizer_defaults=dict(optimizer.defaults), optimizer_state=optimizer.state_dict(),
            loss=self._required("loss"), metrics=list(self.getOrDefault("metrics") or []),
            compression=self.getOrDefault("gradient_compression"), plan=self.plan(data, run_id, num_proc))
        return lambda: _train(config)

    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "TorchModel":
        return TorchModel(history=result["history"], model=cloudpickle.loads(result["model"]),
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

    def _model_bytes(self) -> bytes:
        return cloudpickle.dumps(self.getOrDefault("model"))

    @classmethod
    def _model_from_bytes(cls, data: bytes) -> Any:
        return cloudpickle.loads(data)
