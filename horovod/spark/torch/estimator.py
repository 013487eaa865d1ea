"""`TorchEstimator` / `TorchModel`: the PyTorch half of the Spark estimators.

Every rank rebuilds the model and the optimizer from what the driver sent, takes rank 0's
weights (`broadcast_parameters`, `broadcast_optimizer_state`), trains on its own share of the
Parquet rows with `hvd.DistributedOptimizer`, and rank 0 checkpoints into the store after every
epoch (`torch.save` of the model's and optimizer's state, and the epoch). The model is called as
`model(*features)`, one tensor per feature column; `loss(outputs, labels)` with a float label
reshaped to the output's shape when they hold as many values (a (B,) column against a (B, 1)
output), so a plain `mse_loss` works.

The loop (`train`) is separate from what one batch computes: a `Steps` object says how the
optimizer is built and what one training and one validation batch compute.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import cloudpickle
import numpy as np

from horovod.spark.common.data import PreparedData
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, TrainingPlan, TrainResult, run_callbacks, reshaped
from horovod.spark.common.params import param
from horovod.spark.common.store import checkpoint_file


class Steps(Protocol):
    """What the training loop (`train`) computes for one batch: `ModuleSteps` for an
    `nn.Module` with a loss, or the user's `train_minibatch_fn`."""

    def optimizer(self, model: Any) -> tuple[Any, Any]:
        """The optimizer for this rank's `model`, and an LR scheduler stepped per epoch (or None)."""

    def train_step(self, model: Any, optimizer: Any, batch: dict[str, Any], index: int, last: bool
                   ) -> tuple[Any, dict[str, float]]:
        """One training batch (by column), optimizer step included; the loss and metrics to average
        per epoch. `last`: the epoch's last batch (accumulated gradients must be applied)."""

    def val_step(self, model: Any, batch: dict[str, Any], index: int) -> dict[str, float]:
        """Validation values of one batch (averaged per epoch, e.g. `val_loss`)."""


@dataclass(frozen=True)
class TrainConfig:
    """What a PyTorch rank needs: the model, the estimator's `Steps`, the compression, the plan,
    and the checkpoint to resume from (the bytes `torch.save` wrote, or None)."""

    model: bytes
    steps: Steps
    compression: Any
    plan: TrainingPlan
    backward_passes_per_step: int = 1
    resume_from: bytes | None = None


def transform_outputs(outputs: Any, labels: list[Any]) -> tuple[list[Any], list[Any]]:
    """The outputs as a list, and each label in its output's shape when they hold as many values
    (a (B,) column against a (B, 1) output)."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    labels = [label.reshape(output.shape) if hasattr(output, "shape") and output.numel() == label.numel() else label
              for output, label in zip(outputs, labels)]
    return outputs, labels


@dataclass(frozen=True)
class ModuleSteps:
    """`TorchEstimator`'s steps: `loss(model(*features), labels)`, metrics on the outputs, or the
    user's `train_minibatch_fn` for the whole step."""

    optimizer_cls: type
    optimizer_defaults: dict[str, Any]
    optimizer_state: dict[str, Any]
    losses: Sequence[Any]
    loss_weights: Sequence[float]
    metrics: Sequence[Callable[..., Any]]
    plan: TrainingPlan
    train_minibatch_fn: Callable[[], Callable[..., Any]] | None
    backward_passes_per_step: int

    def optimizer(self, model: Any) -> tuple[Any, Any]:
        optimizer = self.optimizer_cls(model.parameters(), **self.optimizer_defaults)
        optimizer.load_state_dict(self.optimizer_state)
        return optimizer, None

    def unpack(self, batch: dict[str, Any]) -> tuple[list[Any], list[Any], Any]:
        weights = self.plan.sample_weight_col
        return self.plan.inputs(batch), self.plan.labels(batch), batch[weights] if weights else None

    def loss(self, outputs: list[Any], labels: list[Any], sample_weights: Any = None) -> Any:
        """The weighted sum of the outputs' losses; with sample weights, each row's loss
        (`reduction='none'`) times its weight, averaged over the batch."""
        total = 0
        for fn, weight, output, label in zip(self.losses, self.loss_weights, outputs, labels):
            if sample_weights is None:
                value = fn(output, label)
            else:
                value = (fn(output, label, reduction="none").flatten() * sample_weights).mean()
            total = total + weight * value
        return total

    def _metrics(self, outputs: list[Any], labels: list[Any]) -> dict[str, float]:
        with torch_no_grad():
            return {m.__name__: float(m(outputs[0], labels[0])) for m in self.metrics}

    def train_step(self, model: Any, optimizer: Any, batch: dict[str, Any], index: int, last: bool
                   ) -> tuple[Any, dict[str, float]]:
        inputs, labels, weights = self.unpack(batch)
        if self.train_minibatch_fn is not None:
            outputs, loss = self.train_minibatch_fn()(model, optimizer, transform_outputs, self.loss, inputs,
                                                      labels, weights)
            outputs, labels = transform_outputs(outputs, labels)
            return loss, self._metrics(outputs, labels)
        passes = self.backward_passes_per_step
        if index % passes == 0:
            optimizer.zero_grad()
        outputs, labels = transform_outputs(model(*inputs), labels)
        loss = self.loss(outputs, labels, weights)
        loss.backward()
        if (index + 1) % passes == 0 or last:
            optimizer.step()
        return loss, self._metrics(outputs, labels)

    def val_step(self, model: Any, batch: dict[str, Any], index: int) -> dict[str, float]:
        inputs, labels, weights = self.unpack(batch)
        outputs, labels = transform_outputs(model(*inputs), labels)
        return {"val_loss": self.loss(outputs, labels, weights).item()}


def torch_no_grad() -> Any:
    import torch

    return torch.no_grad()


def _batch(torch: Any, arrays: dict[str, np.ndarray], device: Any, plan: TrainingPlan) -> dict[str, Any]:
    """The batch as tensors on the rank's device, features and labels in their shapes."""
    return plan.shaped({col: torch.as_tensor(values).to(device) for col, values in arrays.items()})


def _epoch_means(hvd: Any, sums: dict[str, float], steps: int) -> dict[str, float]:
    """Each value's mean over the epoch's steps and the ranks (gathered as objects: a value one
    rank never produced cannot leave the others waiting in a collective)."""
    gathered = hvd.allgather_object(sums)
    names = sorted({name for rank_sums in gathered for name in rank_sums})
    return {name: sum(s.get(name, 0.0) for s in gathered) / (steps * len(gathered)) for name in names}


def _device(torch: Any, hvd: Any, use_gpu: bool) -> Any:
    """The rank's GPU (by local rank) when `use_gpu` and CUDA has one, else the CPU."""
    if use_gpu and torch.cuda.is_available():
        return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def train(config: TrainConfig) -> TrainResult | None:
    """One rank's training; rank 0 returns the history, the trained model and its output shapes."""
    import torch

    import horovod.torch as hvd

    plan, steps = config.plan, config.steps
    hvd.init()
    try:
        if plan.seed is not None:
            torch.manual_seed(plan.seed)
        device = _device(torch, hvd, plan.use_gpu)
        model = cloudpickle.loads(config.model).to(device)
        optimizer, scheduler = steps.optimizer(model)
        if config.resume_from is not None:
            state = torch.load(io.BytesIO(config.resume_from), map_location=device, weights_only=False)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=config.compression or hvd.Compression.none,
                                             backward_passes_per_step=config.backward_passes_per_step)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        train_reader = plan.train_reader(hvd.rank(), hvd.size())
        val_reader = plan.val_reader(hvd.rank(), hvd.size())
        rng = np.random.default_rng(None if plan.seed is None else plan.seed + hvd.rank())
        history: dict[str, list[float]] = {}
        run_callbacks(plan.callbacks, "on_train_begin", {})
        for epoch in range(plan.epochs):
            run_callbacks(plan.callbacks, "on_epoch_begin", epoch, {})
            model.train()
            sums: dict[str, float] = {}
            batches = train_reader.epoch(plan.batch_size, plan.steps[0], plan.shuffle, rng)
            for i, arrays in enumerate(batches):
                loss, metrics = steps.train_step(model, optimizer, _batch(torch, arrays, device, plan), i,
                                                 i == plan.steps[0] - 1)
                logs = {"loss": float(loss.item()), **metrics}
                run_callbacks(plan.callbacks, "on_batch_end", i, logs)
                for name, value in logs.items():
                    sums[name] = sums.get(name, 0.0) + value
            means = _epoch_means(hvd, sums, plan.steps[0])
            if val_reader is not None:
                model.eval()
                val_sums: dict[str, float] = {}
                with torch.no_grad():
                    for i, arrays in enumerate(val_reader.epoch(plan.val_batch_size, plan.steps[1], False, rng)):
                        for name, value in steps.val_step(model, _batch(torch, arrays, device, plan), i).items():
                            val_sums[name] = val_sums.get(name, 0.0) + value
                means.update(_epoch_means(hvd, val_sums, plan.steps[1]))
            if scheduler is not None:
                scheduler.step()
            for name, value in means.items():
                history.setdefault(name, []).append(value)
            if hvd.rank() == 0:
                buffer = io.BytesIO()
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, buffer)
                plan.store.write(checkpoint_file(plan.store, plan.run_id), buffer.getvalue())
                if plan.verbose:
                    print(f"epoch {epoch + 1}/{plan.epochs}: " +
                          ", ".join(f"{k}={v[-1]:.4f}" for k, v in history.items()), flush=True)
            run_callbacks(plan.callbacks, "on_epoch_end", epoch, dict(means))
        run_callbacks(plan.callbacks, "on_train_end", {})
        if hvd.rank() != 0:
            return None
        model.eval()
        first = {col: values[:1] for col, values in train_reader.arrays().items()}
        with torch.no_grad():
            outputs = model(*plan.inputs(_batch(torch, first, device, plan)))
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        return {"history": history, "model": cloudpickle.dumps(model.cpu()),
                "output_shapes": [tuple(output.shape[1:]) for output in outputs]}
    finally:
        hvd.shutdown()


class TorchEstimator(HorovodEstimator):
    """Fits a `torch.nn.Module` on a DataFrame with Horovod; `fit(df)` returns a `TorchModel`.

    `optimizer` is an optimizer built on `model.parameters()`; each rank builds one like it (same
    class, settings and state) on its own copy of the model. `loss` is a callable
    `loss(outputs, labels)` (or one per output; `loss_constructors` build them on the ranks);
    `metrics` callables `metric(outputs, labels)`. `input_shapes` reshape the feature columns
    (`[[-1, 1, 28, 28]]` turns a 784-value column into images). `callbacks` are objects with any
    of Keras's hooks (`on_train_begin(logs)`, `on_epoch_begin(epoch, logs)`,
    `on_batch_end(batch, logs)`, `on_epoch_end(epoch, logs)`, `on_train_end(logs)`), called on
    every rank. A run whose `run_id` already has a checkpoint in the store resumes from it.
    """

    input_shapes = param("input_shapes", "the shape of each feature column's tensor, e.g. [[-1, 1, 28, 28]]")
    loss_constructors = param("loss_constructors", "functions that build the loss(es) on each rank")
    train_minibatch_fn = param("train_minibatch_fn", "a function returning train_minibatch(model, optimizer, "
                               "transform_outputs, loss_fn, inputs, labels, sample_weights) -> (outputs, loss)")
    data_module = param("data_module", "Horovod's data module class that reads the data")

    _DEFAULTS = {**HorovodEstimator._DEFAULTS, "input_shapes": None, "loss_constructors": None,
                 "train_minibatch_fn": None, "data_module": None}
    _not_honoured = {**HorovodEstimator._not_honoured,
                     "data_module": "the data is read by horovod.spark.common.reader (Petastorm's knobs on pyarrow)",
                     "tensorflow_dataset_prefetch_buffer_size": "it configures a tf.data pipeline (Keras only)"}

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("loss") is not None and kwargs.get("loss_constructors") is not None:
            raise ValueError("only one of loss_constructors and loss parameters can be specified.")
        super().__init__(**kwargs)

    def _losses(self, outputs: int) -> list[Any]:
        constructors = self.getOrDefault("loss_constructors")
        losses = [make() for make in constructors] if constructors else self._required("loss")
        losses = list(losses) if isinstance(losses, (list, tuple)) else [losses]
        return losses * outputs if len(losses) == 1 else losses

    def _resume_from(self, run_id: str) -> bytes | None:
        """The run's last checkpoint, when it has one (a fit with the run_id of an earlier one resumes)."""
        store = self.getOrDefault("store")
        path = checkpoint_file(store, run_id)
        if not store.exists(path):
            return None
        if self.getOrDefault("verbose"):
            print(f"Resuming training from last checkpoint: {path}", flush=True)
        return store.read(path)

    def module_steps(self, plan: TrainingPlan) -> ModuleSteps:
        """What one batch computes with this estimator's optimizer, losses, weights and metrics
        (also what `horovod.spark.lightning` wraps a plain module's training in)."""
        optimizer = self._required("optimizer")
        loss_weights = self.getOrDefault("loss_weights") or [1.0] * len(plan.label_cols)
        return ModuleSteps(
            optimizer_cls=type(optimizer), optimizer_defaults=dict(optimizer.defaults),
            optimizer_state=optimizer.state_dict(), losses=self._losses(len(plan.label_cols)),
            loss_weights=[float(w) for w in loss_weights], metrics=list(self.getOrDefault("metrics") or []),
            plan=plan, train_minibatch_fn=self.getOrDefault("train_minibatch_fn"),
            backward_passes_per_step=int(self.getOrDefault("backward_passes_per_step")))

    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        plan = self.plan(data, run_id, num_proc)
        steps = self.module_steps(plan)
        config = TrainConfig(cloudpickle.dumps(self.getOrDefault("model")), steps,
                             self.getOrDefault("gradient_compression"), plan,
                             steps.backward_passes_per_step, self._resume_from(run_id))
        return lambda: train(config)

    def _model_class(self) -> type["TorchModel"]:
        return TorchModel

    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "TorchModel":
        return self._model_class()(history=result["history"], model=cloudpickle.loads(result["model"]),
                          feature_columns=list(self.getOrDefault("feature_cols")),
                          label_columns=list(self.getOrDefault("label_cols")), run_id=run_id,
                          _metadata={**self._model_metadata(result, data),
                                     "input_shapes": self.getOrDefault("input_shapes")})


class TorchModel(HorovodModel):
    """A trained PyTorch model as a Spark ML transformer: `transform(df)` adds the predictions."""

    def _predict_fn(self) -> Callable[[list[Any]], list[Any]]:
        payload = cloudpickle.dumps(self.getOrDefault("model"))
        shapes = (self.getOrDefault("_metadata") or {}).get("input_shapes")
        loaded: list[Any] = []

        def predict(inputs: list[Any]) -> list[Any]:
            import torch

            if not loaded:
                loaded.append(cloudpickle.loads(payload).eval())
            tensors = [reshaped(torch.as_tensor(array), shape)
                       for array, shape in zip(inputs, shapes or [None] * len(inputs))]
            with torch.no_grad():
                outputs = loaded[0](*tensors)
            outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
            return [output.numpy() for output in outputs]

        return predict

    def model_bytes(self) -> bytes:
        return cloudpickle.dumps(self.getOrDefault("model"))

    @classmethod
    def from_model_bytes(cls, data: bytes, params: dict[str, Any]) -> Any:
        return cloudpickle.loads(data)
