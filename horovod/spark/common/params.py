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
#: Horovod's accessors whose name does not spell their parameter's.
_ACCESSOR_NAMES = {"ShufflingBufferSize": "shuffle_buffer_size", "TrainReaderNumWorker": "train_reader_num_workers",
                   "ValReaderNumWorker": "val_reader_num_workers", "InMemoryCacheAll": "inmemory_cache_all",
                   "NumGPUs": "num_gpus", "LabelColoumns": "label_columns"}


def param(name: str, doc: str) -> Param:
    """A Spark ML parameter of an estimator or model (Horovod declares them on the class)."""
    return Param(Params._dummy(), name, doc)


class _Accessors(Params):
    """`getFooBar()` / `setFooBar(value)` for the parameter `foo_bar`."""

    def __getattr__(self, attr: str) -> Callable[..., Any]:
        match = _ACCESSOR.match(attr)
        name = ""
        if match:
            name = _ACCESSOR_NAMES.get(match.group(2)) or re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(2)).lower()
        if match is None or not isinstance(getattr(type(self), name, None), Param):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        if match.group(1) == "get":
            return lambda: self.getOrDefault(name)
        return lambda value: self._set(**{name: value})


class EstimatorParams(_Accessors):
    """What every Horovod estimator takes (Horovod's `EstimatorParams`)."""

    num_proc = param("num_proc", "number of Horovod processes (Spark tasks); default: the default parallelism")
    model = param("model", "the model to train")
    backend = param("backend", "the Backend that runs training; default SparkBackend(num_proc)")
    store = param("store", "where the training data, checkpoints and logs go (horovod.spark.common.store)")
    optimizer = param("optimizer", "the optimizer")
    loss = param("loss", "the loss function")
    metrics = param("metrics", "metrics to report each epoch")
    feature_cols = param("feature_cols", "the feature columns, one model input each")
    label_cols = param("label_cols", "the label columns")
    validation = param("validation", "a fraction of the rows to hold out, or a boolean column marking them")
    callbacks = param("callbacks", "training callbacks")
    batch_size = param("batch_size", "rows per batch and rank")
    val_batch_size = param("val_batch_size", "rows per validation batch and rank; default batch_size")
    epochs = param("epochs", "passes over the training data")
    verbose = param("verbose", "0: silent, 1: one line per epoch on rank 0")
    random_seed = param("random_seed", "seed for the validation split, shuffling and the model's ranks")
    shuffle = param("shuffle", "shuffle the training rows of each rank every epoch")
    shuffle_buffer_size = param("shuffle_buffer_size", "rows in the shuffling buffer (0: no shuffling); "
                                "default: the rank's whole shard")
    partitions_per_process = param("partitions_per_process", "Parquet partitions written per rank")
    run_id = param("run_id", "the run's directory in the store; default: a new one per fit")
    train_steps_per_epoch = param("train_steps_per_epoch", "batches per epoch; default: rows / (batch_size * num_proc)")
    validation_steps_per_epoch = param("validation_steps_per_epoch", "validation batches per epoch")
    transformation_fn = param("transformation_fn", "a function pandas.DataFrame -> pandas.DataFrame applied to "
                              "the rows as they are read, before batching")
    transformation_edit_fields = param("transformation_edit_fields", "(name, numpy dtype, shape, nullable) of the "
                                       "columns transformation_fn adds or changes: cast and reshaped so")
    transformation_removed_fields = param("transformation_removed_fields", "columns transformation_fn removes")
    sample_weight_col = param("sample_weight_col", "a column weighting each row's loss")
    loss_weights = param("loss_weights", "a weight per loss (per model output): the loss is their weighted sum")
    label_shapes = param("label_shapes", "the shape of each label column's tensor (the rows are reshaped to it)")
    gradient_compression = param("gradient_compression", "hvd.Compression for the gradients")
    compress_sparse_cols = param("compress_sparse_cols", "store SparseVector columns compressed (see docs/spark.md)")
    train_reader_num_workers = param("train_reader_num_workers", "workers reading a rank's training data in parallel")
    val_reader_num_workers = param("val_reader_num_workers", "workers reading a rank's validation data in parallel")
    reader_pool_type = param("reader_pool_type", "the readers' pool: 'thread', 'process' or 'dummy' (no pool)")
    inmemory_cache_all = param("inmemory_cache_all", "read each rank's data once and keep it in memory")
    use_gpu = param("use_gpu", "train on the rank's GPU when there is one")
    mp_start_method = param("mp_start_method", "how a 'process' reader pool starts its processes")
    backward_passes_per_step = param("backward_passes_per_step", "batches whose gradients add up before one "
                                     "allreduce and optimizer step")
    continuous_cols = param("continuous_cols", "continuous columns of Horovod's NVTabular data module")
    categorical_cols = param("categorical_cols", "categorical columns of Horovod's NVTabular data module")
    tensorflow_dataset_prefetch_buffer_size = param("tensorflow_dataset_prefetch_buffer_size",
                                                    "batches prepared ahead of training (Keras)")

    #: Horovod's defaults of the parameters above; an estimator adds its framework's own.
    _DEFAULTS: dict[str, Any] = dict(
        num_proc=None, model=None, backend=None, store=None, optimizer=None, loss=None, metrics=[],
        feature_cols=None, label_cols=None, validation=None, callbacks=[], batch_size=32, val_batch_size=None,
        epochs=1, verbose=1, random_seed=None, shuffle=True, shuffle_buffer_size=None, partitions_per_process=10,
        run_id=None, train_steps_per_epoch=None, validation_steps_per_epoch=None, transformation_fn=None,
        transformation_edit_fields=None, transformation_removed_fields=None, sample_weight_col=None,
        loss_weights=None, label_shapes=None, gradient_compression=None, compress_sparse_cols=False,
        train_reader_num_workers=2, val_reader_num_workers=2, reader_pool_type="thread", inmemory_cache_all=False,
        use_gpu=True, mp_start_method=None, backward_passes_per_step=1, continuous_cols=None, categorical_cols=None,
        tensorflow_dataset_prefetch_buffer_size=None)

    def _estimator_defaults(self) -> None:
        self._setDefault(**self._DEFAULTS)


class ModelParams(_Accessors):
    """What a fitted model carries (Horovod's `ModelParams`)."""

    history = param("history", "the metrics of every epoch, by name")
    model = param("model", "the trained model")
    feature_columns = param("feature_columns", "the feature columns, one model input each")
    label_columns = param("label_columns", "the label columns the model was trained on")
    output_cols = param("output_cols", "the prediction columns transform() adds: <label>__output by default")
    run_id = param("run_id", "the run that trained the model")
    _metadata = param("_metadata", "the shapes of the model's inputs and outputs")

    def _model_defaults(self) -> None:
        self._setDefault(history=None, model=None, feature_columns=None, label_columns=None,
                         output_cols=None, run_id=None, _metadata=None)
