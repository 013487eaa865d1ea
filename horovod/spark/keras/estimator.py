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

import numpy as np

from horovod.spark.common.data import PreparedData, epoch_batches, read_shard
from horovod.spark.common.estimator import HorovodEstimator, HorovodModel, TrainingPlan, TrainResult


def model_to_bytes(model: Any) -> bytes:
    """A Keras model as the bytes of its `.keras` file (Keras 3 saves only to a path)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(data: bytes, compile: bool = True) -> Any:
    """The model of `model_to_bytes`; a trained one was compiled with `hvd.DistributedOptimizer`,
    which Keras finds once `horovod.keras` has registered it."""
    import keras

    import horovod.keras  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.models.load_model(path, compile=compile)


@dataclass(frozen=True)
class _TrainConfig:
    model: bytes
    optimizer: dict[str, Any]  # keras.optimizers.serialize(...)
    loss: Any
    metrics: Sequence[Any]
    callbacks: Sequence[Any]
    plan: TrainingPlan


def _inputs(arrays: dict[str, np.ndarray], cols: Sequence[str], index: np.ndarray) -> Any:
    values = [arrays[col][index] for col in cols]
    return values[0] if len(values) == 1 else tuple(values)


def _batches(arrays: dict[str, np.ndarray], plan: TrainingPlan, batch_size: int, steps: int, shuffle: bool,
             rng: np.random.Generator) -> Iterator[tuple[Any, Any]]:
    rows = len(arrays[plan.feature_cols[0]])
    while True:
        for index in epoch_batches(rows, batch_size, steps, shuffle, rng):
            yield _inputs(arrays, plan.feature_cols, index), _inputs(arrays, plan.label_cols, index)


def _train(config: _TrainConfig) -> TrainResult | None:
    import keras

    import horovod.keras as hvd

    plan = config.plan
    hvd.init()
    try:
        if plan.seed is not None:
            keras.utils.set_random_seed(plan.seed)
        model = model_from_bytes(config.model, compile=False)
        optimizer = hvd.DistributedOptimizer(keras.optimizers.deserialize(config.optimizer))
        model.compile(optimizer=optimizer, loss=config.loss, metrics=list(config.metrics))
        columns = [*plan.feature_cols, *plan.label_cols]
        train = read_shard(plan.store, plan.data.train_path, columns, hvd.rank(), hvd.size())
        rng = np.random.default_rng(None if plan.seed is None else plan.seed + hvd.rank())
        validation: dict[str, Any] = {}
        if plan.data.val_path and plan.steps[1]:
            val = read_shard(plan.store, plan.data.val_path, columns, hvd.rank(), hvd.size())
            validation = {"validation_data": _batches(val, plan, plan.val_batch_size, plan.steps[1], False, rng),
                          "validation_steps": plan.steps[1]}
        store, checkpoint = plan.store, plan.store.get_checkpoint_path(plan.run_id)

        class _Checkpoint(keras.callbacks.Callback):
            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                store.write(checkpoint, model_to_bytes(self.model))

        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                     *config.callbacks, *([_Checkpoint()] if hvd.rank() == 0 else [])]
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

    `optimizer` is a Keras optimizer (each rank builds one from its config); `loss` and `metrics`
    are what `model.compile` takes; `callbacks` run on every rank after Horovod's own.
    """

    _unsupported = ("gradient_compression",)

    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        import keras

        config = _TrainConfig(
            model=model_to_bytes(self.getOrDefault("model")),
            optimizer=keras.optimizers.serialize(self._required("optimizer")), loss=self._required("loss"),
            metrics=list(self.getOrDefault("metrics") or []), callbacks=list(self.getOrDefault("callbacks") or []),
            plan=self.plan(data, run_id, num_proc))
        return lambda: _train(config)

    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "KerasModel":
        return KerasModel(history=result["history"], model=model_from_bytes(result["model"]),
                          feature_columns=list(self.getOrDefault("feature_cols")),
                          label_columns=list(self.getOrDefault("label_cols")), run_id=run_id,
                          _metadata={"output_shapes": result["output_shapes"], "shapes": data.shapes})


class KerasModel(HorovodModel):
    """A trained Keras model as a Spark ML transformer: `transform(df)` adds the predictions."""

    def _predict_fn(self) -> Callable[[list[Any]], list[Any]]:
        payload = model_to_bytes(self.getOrDefault("model"))
        loaded: list[Any] = []

        def predict(inputs: list[Any]) -> list[Any]:
            if not loaded:
                loaded.append(model_from_bytes(payload, compile=False))
            outputs = loaded[0].predict(inputs[0] if len(inputs) == 1 else inputs, verbose=0)
            return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]

        return predict

    def model_bytes(self) -> bytes:
        return model_to_bytes(self.getOrDefault("model"))

    @classmethod
    def from_model_bytes(cls, data: bytes) -> Any:
        return model_from_bytes(data)
