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
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import fsspec
import pandas as pd
from pyspark.ml import Estimator, Model
from pyspark.ml.util import MLReadable, MLReader, MLWritable, MLWriter

from horovod.spark.common.backend import Backend, SparkBackend
from horovod.spark.common.data import PreparedData, column_array, prepare_data
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

_SAVED_PARAMS = ("history", "feature_columns", "label_columns", "output_cols", "run_id", "_metadata")


class HorovodEstimator(Estimator, EstimatorParams):
    """The framework-independent half of `TorchEstimator` and `KerasEstimator`."""

    #: Parameters this framework's training does not apply: refused rather than ignored.
    _unsupported: tuple[str, ...] = ()

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
        for name in ("sample_weight_col", "transformation_fn", *self._unsupported):
            if self.getOrDefault(name) not in (None, []):
                raise NotImplementedError(f"{type(self).__name__}: {name}= is not supported here yet")
        backend = self._get_or_create_backend()
        num_proc = backend.num_processes()
        run_id = self.getOrDefault("run_id") or f"{type(self).__name__.lower()}_{uuid.uuid4().hex[:12]}"
        data = prepare_data(df, store, run_id, feature_cols, label_cols, self.getOrDefault("validation"),
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
            seed=self.getOrDefault("random_seed"), verbose=int(self.getOrDefault("verbose")))

    @abc.abstractmethod
    def _remote_trainer(self, data: PreparedData, run_id: str, num_proc: int) -> Callable[[], TrainResult | None]:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def _create_model(self, result: TrainResult, run_id: str, data: PreparedData) -> "HorovodModel":
        """Defined by each concrete class."""


class HorovodModel(Model, ModelParams, MLWritable, MLReadable):
    """The framework-independent half of `TorchModel` and `KerasModel`."""

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
        from pyspark.ml.functions import vector_to_array
        from pyspark.ml.linalg import VectorUDT
        from pyspark.sql.functions import pandas_udf
        from pyspark.sql.types import ArrayType, DoubleType, StructField, StructType

        features, outputs = list(self.getOrDefault("feature_columns")), self.output_columns()
        shapes = self.getOrDefault("_metadata")["output_shapes"]
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
        inputs = [vector_to_array(df[col]) if isinstance(types.get(col), VectorUDT) else df[col] for col in features]
        packed = "__hvd_outputs"
        return (df.withColumn(packed, pandas_udf(apply, schema)(*inputs))
                .select("*", f"{packed}.*").drop(packed))

    @abc.abstractmethod
    def _predict_fn(self) -> Callable[[list[Any]], list[Any]]:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def model_bytes(self) -> bytes:
        """The framework's own serialisation of the trained model (what `save` writes as model.bin)."""

    @classmethod
    @abc.abstractmethod
    def from_model_bytes(cls, data: bytes) -> Any:
        """The framework's model back from `model_bytes` (what `load` reads from model.bin)."""

    def write(self) -> MLWriter:
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _ModelReader(cls)


class _ModelWriter(MLWriter):
    """Saves a model as `metadata.json` (its parameters) and `model.bin` (the framework's bytes)."""

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
        with fs.open(posixpath.join(root, "model.bin"), "rb") as f:
            model = self.cls.from_model_bytes(f.read())
        params = metadata["params"]
        if params.get("_metadata"):
            params["_metadata"]["output_shapes"] = [tuple(s) for s in params["_metadata"]["output_shapes"]]
        return self.cls(model=model, **params)
