"""The Spark ML parameters of the estimators and their models, with Horovod's names and defaults.

Each parameter is a Spark ML `Param`, so estimators copy, explain and persist like any Spark ML
stage. Horovod's accessors (`setBatchSize(64)`, `getBatchSize()`, ... one pair per parameter)
map to the parameter of the snake_case name: `_Accessors` turns the one into the other instead of
spelling out a hundred near-identical methods.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from pyspark.ml.param import Param, Params

_ACCESSOR = re.compile(r"^(get|set)([A-Z]\w*)$")


def _param(name: str, doc: str) -> Param:
    return Param(Params._dummy(), name, doc)


class _Accessors(Params):
    """`getFooBar()` / `setFooBar(value)` for the parameter `foo_bar`."""

    def __getattr__(self, attr: str) -> Callable[..., Any]:
        match = _ACCESSOR.match(attr)
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(2)).lower() if match else ""
        if match is None or not isinstance(getattr(type(self), name, None), Param):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        if match.group(1) == "get":
            return lambda: self.getOrDefault(name)
        return lambda value: self._set(**{name: value})


class EstimatorParams(_Accessors):
    """What every Horovod estimator takes (Horovod's `EstimatorParams`)."""

    num_proc = _param("num_proc", "number of Horovod processes (Spark tasks); default: the default parallelism")
    model = _param("model", "the model to train")
    backend = _param("backend", "the Backend that runs training; default SparkBackend(num_proc)")
    store = _param("store", "where the training data, checkpoints and logs go (horovod.spark.common.store)")
    optimizer = _param("optimizer", "the optimizer")
    loss = _param("loss", "the loss function")
    metrics = _param("metrics", "metrics to report each epoch")
    feature_cols = _param("feature_cols", "the feature columns, one model input each")
    label_cols = _param("label_cols", "the label columns")
    validation = _param("validation", "a fraction of the rows to hold out, or a boolean column marking them")
    callbacks = _param("callbacks", "training callbacks")
    batch_size = _param("batch_size", "rows per batch and rank")
    val_batch_size = _param("val_batch_size", "rows per validation batch and rank; default batch_size")
    epochs = _param("epochs", "passes over the training data")
    verbose = _param("verbose", "0: silent, 1: one line per epoch on rank 0")
    random_seed = _param("random_seed", "seed for the validation split, shuffling and the model's ranks")
    shuffle = _param("shuffle", "shuffle the training rows of each rank every epoch")
    shuffle_buffer_size = _param("shuffle_buffer_size", "accepted for Horovod's API; each rank shuffles its whole shard")
    partitions_per_process = _param("partitions_per_process", "Parquet partitions written per rank")
    run_id = _param("run_id", "the run's directory in the store; default: a new one per fit")
    train_steps_per_epoch = _param("train_steps_per_epoch", "batches per epoch; default: rows / (batch_size * num_proc)")
    validation_steps_per_epoch = _param("validation_steps_per_epoch", "validation batches per epoch")
    transformation_fn = _param("transformation_fn", "not supported here (refused)")
    sample_weight_col = _param("sample_weight_col", "not supported here (refused)")
    gradient_compression = _param("gradient_compression", "hvd.Compression for the gradients")

    def _estimator_defaults(self) -> None:
        self._setDefault(num_proc=None, model=None, backend=None, store=None, optimizer=None, loss=None,
                         metrics=[], feature_cols=None, label_cols=None, validation=None, callbacks=[],
                         batch_size=32, val_batch_size=None, epochs=1, verbose=1, random_seed=None,
                         shuffle=True, shuffle_buffer_size=None, partitions_per_process=10, run_id=None,
                         train_steps_per_epoch=None, validation_steps_per_epoch=None,
                         transformation_fn=None, sample_weight_col=None, gradient_compression=None)


class ModelParams(_Accessors):
    """What a fitted model carries (Horovod's `ModelParams`)."""

    history = _param("history", "the metrics of every epoch, by name")
    model = _param("model", "the trained model")
    feature_columns = _param("feature_columns", "the feature columns, one model input each")
    label_columns = _param("label_columns", "the label columns the model was trained on")
    output_cols = _param("output_cols", "the prediction columns transform() adds: <label>__output by default")
    run_id = _param("run_id", "the run that trained the model")
    _metadata = _param("_metadata", "the shapes of the model's inputs and outputs")

    def _model_defaults(self) -> None:
        self._setDefault(history=None, model=None, feature_columns=None, label_columns=None,
                         output_cols=None, run_id=None, _metadata=None)
