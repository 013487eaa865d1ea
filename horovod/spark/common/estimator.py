"""The Spark ML face of the estimators: `fit(df)` trains with Horovod, the model's `transform(df)`
predicts, and fitted models save and load with Spark ML's persistence.

`HorovodEstimator._fit` is the same for every framework: write the data to the store
(`data.prepare_data`), run the framework's training function through the estimator's backend
(`backend=`, else a `SparkBackend` of `num_proc` ranks running `horovod.spark.run`), and wrap rank 0's result in the framework's model. A framework supplies
`_remote_trainer` (the function every rank runs) and `_create_model`; its model supplies
`_predict_fn` (what runs on the executors in `transform`) and how its model turns into bytes.
"""

from __future__ import annotations

import abc
import json
import math
import posixpath
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import cloudpickle
import fsspec
import pandas as pd
from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from horovod.spark.common.backend import Backend, SparkBackend
from horovod.spark.common.data import PreparedData, prepare_data
from horovod.spark.common.reader import ReaderOptions, ShardReader, column_array
from horovod.spark.common.params import EstimatorParams, ModelParams
from horovod.spark.common.store import FilesystemStore

#: What a rank's training function returns on rank 0 (others return None).
TrainResult = dict[str, Any]


@dataclass(frozen=True)
class TrainingPlan:
    """What every framework's training function needs besides the model, as plain values (the
    estimator itself stays on the driver)."""

    store: FilesystemStore
    run_id: str
    data: PreparedData
    feature_cols: Sequence[str]
    label_cols: Sequence[str]
    batch_size: int
    val_batch_size: int
    epochs: int
    steps: tuple[int, int]  # (training, validation) batches per epoch and rank
    shuffle: bool
    seed: int | None
    verbose: int
    reader: ReaderOptions
    sample_weight_col: str | None
    input_shapes: Sequence[Sequence[int]] | None
    label_shapes: Sequence[Sequence[int]] | None
    callbacks: Sequence[Any]
    use_gpu: bool

    @property
    def columns(self) -> list[str]:
        """The columns every rank reads: features, labels and the sample weights."""
        weights = [self.sample_weight_col] if self.sample_weight_col else []
        return list(dict.fromkeys([*self.feature_cols, *self.label_cols, *weights]))

    def train_reader(self, rank: int, size: int) -> ShardReader:
        return ShardReader(self.store, self.data.train_path, self.columns, rank, size, self.reader,
                           self.reader.train_workers)

    def val_reader(self, rank: int, size: int) -> ShardReader | None:
        """The rank's validation rows, or None when there are none to validate on."""
        if not self.data.val_path or not self.steps[1]:
            return None
        return ShardReader(self.store, self.data.val_path, self.columns, rank, size, self.reader,
                           self.reader.val_workers)

    def shaped(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with its feature and label columns in `input_shapes` / `label_shapes`."""
        return {**batch, **dict(zip(self.feature_cols, self.inputs(batch))),
                **dict(zip(self.label_cols, self.labels(batch)))}

    def inputs(self, batch: dict[str, Any]) -> list[Any]:
        """The batch's feature columns, reshaped to `input_shapes` when given."""
        shapes = self.input_shapes or [None] * len(self.feature_cols)
        return [reshaped(batch[col], shape) for col, shape in zip(self.feature_cols, shapes)]

    def labels(self, batch: dict[str, Any]) -> list[Any]:
        """The batch's label columns, reshaped to `label_shapes` when given."""
        shapes = self.label_shapes or [None] * len(self.label_cols)
        return [reshaped(batch[col], shape) for col, shape in zip(self.label_cols, shapes)]


def reshaped(values: Any, shape: Sequence[int] | None) -> Any:
    """An array or tensor of rows in `shape` (Horovod's input_shapes / label_shapes, with or
    without the leading -1 of the batch); as it is when `shape` is None."""
    if shape is None:
        return values
    shape = [int(n) for n in shape]
    return values.reshape(shape if shape and shape[0] == -1 else [-1, *shape])


def run_callbacks(callbacks: Sequence[Any], hook: str, *args: Any) -> None:
    """Call `hook` (Keras's callback names: on_train_begin, on_epoch_end, ...) on each callback
    that defines it."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if callable(method):
            method(*args)

_INTEGRAL_TYPES = ("tinyint", "smallint", "int", "bigint")


def _typed_output(column: Any, label_type: str | None, one: bool) -> Any:
    """A prediction column (a double, or an array of doubles) in the type Horovod gives it for a
    label of Spark type `label_type` (see `PreparedData.column_types`)."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.ml.linalg import SparseVector, VectorUDT
    from pyspark.sql.functions import array, round as round_, udf

    if label_type in ("dense_vector", "sparse_vector"):
        values = array(column) if one else column
        if label_type == "dense_vector":
            return array_to_vector(values)
        to_sparse = udf(lambda v: SparseVector(len(v), {i: x for i, x in enumerate(v) if x != 0.0}), VectorUDT())
        return to_sparse(values)
    if not one:
        return array_to_vector(column)
    if label_type in _INTEGRAL_TYPES:
        return round_(column).cast(label_type)
    if label_type == "float":
        return column.cast("float")
    return column


_SAVED_PARAMS = ("history", "feature_columns", "label_columns", "output_cols", "run_id", "_metadata")


class HorovodEstimator(Estimator, EstimatorParams):
    """The framework-independent half of `TorchEstimator` and `KerasEstimator`."""

    #: Parameters this framework's training does not apply: refused rather than ignored.
    _unsupported: tuple[str, ...] = ()
    #: Parameters that cannot mean here what they mean in Horovod, and why: set to anything but
    #: their default, they warn at fit time (docs/spark.md lists them).
    _not_honoured: dict[str, str] = {
        "compress_sparse_cols": "SparseVector columns are always written dense (as arrays of doubles)",
        "continuous_cols": "only Horovod's NVTabular data module reads it, and there is none here",
        "categorical_cols": "only Horovod's NVTabular data module reads it, and there is none here",
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._estimator_defaults()
        unknown = sorted(name for name in kwargs if not self.hasParam(name))
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown parameters: {', '.join(unknown)}")
        self._set(**kwargs)

    def setParams(self, **kwargs: Any) -> "HorovodEstimator":
        self._set(**kwargs)
        return self

    def _required(self, name: str) -> Any:
        value = self.getOrDefault(name)
        if value is None or value == []:
            raise ValueError(f"{type(self).__name__}: {name}= is required")
        return value

    def _fit(self, df: Any) -> Model:
        store = self._required("store")
        if not isinstance(store, FilesystemStore):
            raise TypeError(f"store= must be a horovod.spark.common.store.Store, got {type(store).__name__}")
        self._required("model")
        feature_cols, label_cols = list(self._required("feature_cols")), list(self._required("label_cols"))
        for name in self._unsupported:
            if self.getOrDefault(name) not in (None, []):
                raise NotImplementedError(f"{type(self).__name__}: {name}= is not supported here yet")
        for name, reason in self._not_honoured.items():
            if self.getOrDefault(name) != self._DEFAULTS.get(name):
                warnings.warn(f"{type(self).__name__}: {name}= has no effect here: {reason}", UserWarning,
                              stacklevel=3)
        weights = [self.getOrDefault("sample_weight_col")] if self.getOrDefault("sample_weight_col") else []
        backend = self._get_or_create_backend()
        num_proc = backend.num_processes()
        run_id = self.getOrDefault("run_id") or f"{type(self).__name__.lower()}_{uuid.uuid4().hex[:12]}"
        data = prepare_data(df, store, run_id, [*feature_cols, *label_cols, *weights], self.getOrDefault("validation"),
                            max(1, num_proc * int(self.getOrDefault("partitions_per_process"))),
                            self.getOrDefault("random_seed"))
        if data.train_rows < num_proc:
            raise ValueError(f"{data.train_rows} training rows cannot feed {num_proc} ranks: lower num_proc")
        trainer = self._remote_trainer(data, run_id, num_proc)
        results = backend.run(trainer, args=(), kwargs={}, env=self._backend_env())
        return self._create_model(results[0], run_id, data)

    def _get_or_create_backend(self) -> Backend:
        """The backend given, else a `SparkBackend` of `num_proc` ranks (giving both is an error:
        the backend decides how many ranks run)."""
        backend, num_proc = self.getOrDefault("backend"), self.getOrDefault("num_proc")
        if backend is None:
            return SparkBackend(num_proc, verbose=int(self.getOrDefault("verbose")))
        if num_proc is not None:
            raise ValueError('At most one of parameters "backend" and "num_proc" may be specified')
        if not isinstance(backend, Backend):
            raise TypeError(f"backend= must be a horovod.spark.common.backend.Backend, got {type(backend).__name__}")
        return backend

    def _backend_env(self) -> dict[str, str]:
        """Variables added to the ranks' environment for this fit (Keras's `backend_env`)."""
        return {}

    def plan(self, data: PreparedData, run_id: str, num_proc: int) -> TrainingPlan:
        """The run's plan; the batches per epoch are the same on every rank (each is a collective)."""
        batch = int(self.getOrDefault("batch_size"))
        val_batch = int(self.getOrDefault("val_batch_size") or batch)
        train = self.getOrDefault("train_steps_per_epoch") or math.ceil(data.train_rows / (batch * num_proc))
        val = self.getOrDefault("validation_steps_per_epoch") or (
            math.ceil(data.val_rows / (val_batch * num_proc)) if data.val_rows >= num_proc else 0)
        return TrainingPlan(
            store=self.getOrDefault("store"), run_id=run_id, data=data,
            feature_cols=list(self.getOrDefault("feature_cols")), label_cols=list(self.getOrDefault("label_cols")),
            batch_size=batch, val_batch_size=val_batch, epochs=int(self.getOrDefault("epochs")),
            steps=(int(train), int(val)), shuffle=bool(self.getOrDefault("shuffle")),
            seed=self.getOrDefault("random_seed"), verbose=int(self.getOrDefault("verbose")),
            reader=ReaderOptions(
                pool_type=self.getOrDefault("reader_pool_type"),
                train_workers=int(self.getOrDefault("train_reader_num_workers")),
                val_workers=int(self.getOrDefault("val_reader_num_workers")),
                cache_all=bool(self.getOrDefault("inmemory_cache_all")),
                shuffle_buffer_size=self.getOrDefault("shuffle_buffer_size"),
                mp_start_method=self.getOrDefault("mp_start_method"),
                transformation_fn=self.getOrDefault("transformation_fn"),
                edit_fields=self.getOrDefault("transformation_edit_fields"),
                removed_fields=self.getOrDefault("transformation_removed_fields")),
            sample_weight_col=self.getOrDefault("sample_weight_col"),
            input_shapes=self.getOrDefault("input_shapes") if self.hasParam("input_shapes") else None,
            label_shapes=self.getOrDefault("label_shapes"), callbacks=list(self.getOrDefault("callbacks") or []),
            use_gpu=bool(self.getOrDefault("use_gpu")))

    def _model_metadata(self, result: TrainResult, data: PreparedData) -> dict[str, Any]:
        """What a fitted model keeps of its training: output shapes, column shapes and types."""
        return {"output_shapes": result["output_shapes"], "shapes": data.shapes, "column_types": data.column_types}

    @abc.abstractmethod
    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "HorovodModel":
        """Defined by each concrete class."""


class HorovodModel(Model, ModelParams, MLWritable, MLReadable):
    """The framework-independent half of `TorchModel` and `KerasModel`."""

    #: Parameters that are Python objects (Keras's `custom_objects`: the user's classes): saved
    #: with cloudpickle beside the JSON ones, and read back before the model, which needs them.
    _PICKLED_PARAMS: tuple[str, ...] = ()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self._model_defaults()
        self._set(**kwargs)

    def setOutputCols(self, value: Sequence[str]) -> "HorovodModel":
        return self._set(output_cols=list(value))

    def output_columns(self) -> list[str]:
        return list(self.getOrDefault("output_cols") or
                    [f"{label}__output" for label in self.getOrDefault("label_columns")])

    def _transform(self, df: Any) -> Any:
        """`df` with one prediction column per output, as Horovod's models: an ML vector (dense or
        sparse) for a vector label, the label's own type for a number (integers rounded), and a
        dense vector where a numeric label gets several values (e.g. class scores)."""
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.functions import col, pandas_udf
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

        features, outputs = list(self.getOrDefault("feature_columns")), self.output_columns()
        metadata = self.getOrDefault("_metadata")
        shapes, label_types = metadata["output_shapes"], metadata.get("column_types", {})
        if len(shapes) != len(outputs):
            raise ValueError(f"the model has {len(shapes)} outputs but output_cols names {len(outputs)}")
        scalar = [math.prod(shape) <= 1 for shape in shapes]
        schema = StructType([StructField(name, DoubleType() if one else ArrayType(DoubleType()))
                             for name, one in zip(outputs, scalar)])
        predict = self._predict_fn()

        def apply(*columns: pd.Series) -> pd.DataFrame:
            results = predict([column_array(column.tolist()) for column in columns])
            frame = {}
            for name, one, values in zip(outputs, scalar, results):
                flat = values.reshape(len(columns[0]), -1).astype(float)
                frame[name] = flat[:, 0] if one else list(flat)
            return pd.DataFrame(frame, index=columns[0].index)

        types = {field.name: field.dataType for field in df.schema.fields}
        inputs = [vector_to_array(df[c]) if isinstance(types.get(c), VectorUDT) else df[c] for c in features]
        packed = "__hvd_outputs"
        typed = [_typed_output(col(f"{packed}.{name}"), label_types.get(label), one).alias(name)
                 for name, label, one in zip(outputs, self.getOrDefault("label_columns"), scalar)]
        return df.withColumn(packed, pandas_udf(apply, schema)(*inputs)).select("*", *typed).drop(packed)

    @abc.abstractmethod
    def _predict_fn(self) -> Callable[[list[Any]], list[Any]]:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def model_bytes(self) -> bytes:
        """The framework's own serialisation of the trained model (what `save` writes as model.bin)."""

    @classmethod
    @abc.abstractmethod
    def from_model_bytes(cls, data: bytes, params: dict[str, Any]) -> Any:
        """The framework's model back from `model_bytes` (what `load` reads from model.bin), given
        the model's `_PICKLED_PARAMS`."""

    def write(self) -> MLWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _ModelReader(cls)


class _ModelWriter(MLWriter):
    """Saves a model as `metadata.json` (its parameters), `model.bin` (the framework's bytes) and,
    for a model with `_PICKLED_PARAMS`, `params.pkl` (those, cloudpickled)."""

    def __init__(self, instance: HorovodModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        fs, root = fsspec.core.url_to_fs(path)
        fs.makedirs(root, exist_ok=True)
        params = {name: self.instance.getOrDefault(name) for name in _SAVED_PARAMS}
        metadata = {"class": f"{type(self.instance).__module__}.{type(self.instance).__qualname__}", "params": params}
        with fs.open(posixpath.join(root, "metadata.json"), "w") as f:
            json.dump(metadata, f)
        with fs.open(posixpath.join(root, "model.bin"), "wb") as f:
            f.write(self.instance.model_bytes())
        if self.instance._PICKLED_PARAMS:
            pickled = {name: self.instance.getOrDefault(name) for name in self.instance._PICKLED_PARAMS}
            with fs.open(posixpath.join(root, "params.pkl"), "wb") as f:
                f.write(cloudpickle.dumps(pickled))


class _ModelReader(MLReader):
    def __init__(self, cls: type[HorovodModel]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> HorovodModel:
        fs, root = fsspec.core.url_to_fs(path)
        with fs.open(posixpath.join(root, "metadata.json"), "r") as f:
            metadata = json.load(f)
        expected = f"{self.cls.__module__}.{self.cls.__qualname__}"
        if metadata.get("class") != expected:
            raise ValueError(f"{path} holds a {metadata.get('class')}, not a {expected}")
        pickled: dict[str, Any] = {}
        if self.cls._PICKLED_PARAMS:
            with fs.open(posixpath.join(root, "params.pkl"), "rb") as f:
                pickled = cloudpickle.loads(f.read())
        with fs.open(posixpath.join(root, "model.bin"), "rb") as f:
            model = self.cls.from_model_bytes(f.read(), pickled)
        params = {**metadata["params"], **pickled}
        if params.get("_metadata"):
            params["_metadata"]["output_shapes"] = [tuple(s) for s in params["_metadata"]["output_shapes"]]
        return self.cls(model=model, **params)
