"""`KerasEstimator` / `KerasModel`: the Keras half of the Spark estimators.

Every rank loads the model from its `.keras` file, compiles it with the optimizer (rebuilt from
its config) wrapped in `hvd.DistributedOptimizer`, takes rank 0's weights
(`BroadcastGlobalVariablesCallback`), averages the metrics over the ranks
(`MetricAverageCallback`) and trains on its own share of the Parquet rows, `train_steps_per_epoch`
batches an epoch on every rank; rank 0 saves the model (`.keras`) into the store after each epoch.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import cloudpickle
import numpy as np

from horovod.spark.common.data import PreparedData
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, TrainingPlan, TrainResult
from horovod.spark.common.params import param
from horovod.spark.common.reader import ShardReader
from horovod.spark.common.store import checkpoint_file
from horovod.spark.keras.serialization import model_from_bytes, model_to_bytes


@dataclass(frozen=True)
class _TrainConfig:
    model: bytes
    optimizer: dict[str, Any]  # keras.optimizers.serialize(...)
    loss: Any
    loss_weights: Sequence[float] | None
    metrics: Sequence[Any]
    custom_objects: dict[str, Any]
    compression: Any
    checkpoint_callback: Any
    plan: TrainingPlan


def _batches(reader: ShardReader, plan: TrainingPlan, batch_size: int, steps: int, shuffle: bool,
             rng: np.random.Generator) -> Iterator[tuple[Any, ...]]:
    """(inputs, labels) batches, or (inputs, labels, sample weights) with `sample_weight_col`, epoch
    after epoch (Keras draws `steps` of them an epoch)."""
    one = lambda values: values[0] if len(values) == 1 else tuple(values)  # noqa: E731
    while True:
        for batch in reader.epoch(batch_size, steps, shuffle, rng):
            x, y = one(plan.inputs(batch)), one(plan.labels(batch))
            yield (x, y, batch[plan.sample_weight_col]) if plan.sample_weight_col else (x, y)


def _checkpoint_callbacks(keras: Any, config: _TrainConfig, model: Any, workdir: str) -> list[Any]:
    """Rank 0's checkpointing into the store after every epoch: the user's `checkpoint_callback`
    (a `ModelCheckpoint`, writing to a local file that is then copied), or the whole model."""
    store, path = config.plan.store, checkpoint_file(config.plan.store, config.plan.run_id)
    user = config.checkpoint_callback
    weights_only = bool(getattr(user, "save_weights_only", False))
    local = os.path.join(workdir, "checkpoint.weights.h5" if weights_only else "checkpoint.keras")
    if user is not None:
        user.filepath = local

    class _ToStore(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if user is None:
                store.write(path, model_to_bytes(self.model))
            elif os.path.exists(local):
                with open(local, "rb") as f:
                    store.write(path, f.read())

    return [*([user] if user is not None else []), _ToStore()]


def _train(config: _TrainConfig) -> TrainResult | None:
    import keras

    import horovod.keras as hvd

    plan = config.plan
    hvd.init()
    try:
        if plan.seed is not None:
            keras.utils.set_random_seed(plan.seed)
        model = model_from_bytes(config.model, compile=False, custom_objects=config.custom_objects)
        optimizer = hvd.DistributedOptimizer(keras.optimizers.deserialize(config.optimizer),
                                             compression=config.compression or hvd.Compression.none)
        model.compile(optimizer=optimizer, loss=config.loss, loss_weights=config.loss_weights,
                      metrics=list(config.metrics))
        train = plan.train_reader(hvd.rank(), hvd.size())
        rng = np.random.default_rng(None if plan.seed is None else plan.seed + hvd.rank())
        validation: dict[str, Any] = {}
        val = plan.val_reader(hvd.rank(), hvd.size())
        if val is not None:
            validation = {"validation_data": _batches(val, plan, plan.val_batch_size, plan.steps[1], False, rng),
                          "validation_steps": plan.steps[1]}
        with tempfile.TemporaryDirectory() as workdir:
            callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                         *plan.callbacks,
                         *(_checkpoint_callbacks(keras, config, model, workdir) if hvd.rank() == 0 else [])]
            history = model.fit(_batches(train, plan, plan.batch_size, plan.steps[0], plan.shuffle, rng),
                                steps_per_epoch=plan.steps[0], epochs=plan.epochs, callbacks=callbacks,
                                verbose=2 if plan.verbose and hvd.rank() == 0 else 0, shuffle=False, **validation)
        if hvd.rank() != 0:
            return None
        outputs = model.outputs
        return {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
                "model": model_to_bytes(model), "output_shapes": [tuple(o.shape[1:]) for o in outputs]}
    finally:
        hvd.shutdown()


class KerasEstimator(HorovodEstimator):
    """Fits a compiled-or-not Keras model on a DataFrame with Horovod; `fit(df)` returns a `KerasModel`.

    `optimizer` is a Keras optimizer (each rank builds one from its config); `loss`, `loss_weights`
    and `metrics` are what `model.compile` takes; `callbacks` run on every rank after Horovod's own.
    `custom_objects` name the model's own classes and functions; `checkpoint_callback` (a
    `ModelCheckpoint`, e.g. `hvd.callbacks.BestModelCheckpoint`) decides what rank 0 checkpoints
    into the store; `backend_env` is added to the ranks' environment. A run whose `run_id` already
    has a checkpoint in the store resumes from it.
    """

    custom_objects = param("custom_objects", "the model's own layers, losses, ... by name, for loading it")
    checkpoint_callback = param("checkpoint_callback", "a ModelCheckpoint deciding what rank 0 checkpoints")
    backend_env = param("backend_env", "variables added to the ranks' environment")

    _DEFAULTS = {**HorovodEstimator._DEFAULTS, "custom_objects": {}, "checkpoint_callback": None,
                 "backend_env": None}
    _not_honoured = {**HorovodEstimator._not_honoured,
                     "tensorflow_dataset_prefetch_buffer_size":
                         "batches come from a Python generator read ahead by the reader, not a tf.data pipeline"}

    def _backend_env(self) -> dict[str, str]:
        return dict(self.getOrDefault("backend_env") or {})

    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        import keras

        store = self.getOrDefault("store")
        checkpoint = checkpoint_file(store, run_id)
        model = model_to_bytes(self.getOrDefault("model"))
        if store.exists(checkpoint):
            if self.getOrDefault("verbose"):
                print(f"Resuming training from last checkpoint: {checkpoint}", flush=True)
            model = store.read(checkpoint)
        config = _TrainConfig(
            model=model, optimizer=keras.optimizers.serialize(self._required("optimizer")),
            loss=self._required("loss"), loss_weights=self.getOrDefault("loss_weights"),
            metrics=list(self.getOrDefault("metrics") or []),
            custom_objects=dict(self.getOrDefault("custom_objects") or {}),
            compression=self.getOrDefault("gradient_compression"),
            checkpoint_callback=self.getOrDefault("checkpoint_callback"), plan=self.plan(data, run_id, num_proc))
        return lambda: _train(config)

    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "KerasModel":
        custom_objects = dict(self.getOrDefault("custom_objects") or {})
        return KerasModel(history=result["history"], custom_objects=custom_objects,
                          model=model_from_bytes(result["model"], custom_objects=custom_objects),
                          feature_columns=list(self.getOrDefault("feature_cols")),
                          label_columns=list(self.getOrDefault("label_cols")), run_id=run_id,
                          _metadata=self._model_metadata(result, data))


class KerasModel(HorovodModel):
    """A trained Keras model as a Spark ML transformer: `transform(df)` adds the predictions."""

    custom_objects = param("custom_objects", "the model's own layers, losses, ... by name, for loading it")

    _PICKLED_PARAMS = ("custom_objects",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._setDefault(custom_objects={})

    def _predict_fn(self) -> Callable[[list[Any]], list[Any]]:
        payload = model_to_bytes(self.getOrDefault("model"))
        # By value, with this process's cloudpickle settings (Spark pickles the UDF with its own copy).
        objects = cloudpickle.dumps(dict(self.getOrDefault("custom_objects") or {}))
        loaded: list[Any] = []

        def predict(inputs: list[Any]) -> list[Any]:
            if not loaded:
                loaded.append(model_from_bytes(payload, compile=False, custom_objects=cloudpickle.loads(objects)))
            outputs = loaded[0].predict(inputs[0] if len(inputs) == 1 else inputs, verbose=0)
            return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]

        return predict

    def model_bytes(self) -> bytes:
        return model_to_bytes(self.getOrDefault("model"))

    @classmethod
    def from_model_bytes(cls, data: bytes, params: dict[str, Any]) -> Any:
        return model_from_bytes(data, custom_objects=params.get("custom_objects") or None)
