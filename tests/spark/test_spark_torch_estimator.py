"""TorchEstimator end to end on the real Spark cluster: fit, transform, checkpoint, save and load."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(600)

torch = pytest.importorskip("torch")

from tests.spark.helpers import linear_frame  # noqa: E402


def test_fit_transform_checkpoint_save_load(spark, tmp_path):
    from horovod.spark.common.store import LocalStore, Store, checkpoint_file
    from horovod.spark.torch import TorchEstimator, TorchModel

    store = Store.create(str(tmp_path / "store"))
    assert isinstance(store, LocalStore)
    model = torch.nn.Linear(2, 1)
    estimator = TorchEstimator(num_proc=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.2),
                               loss=torch.nn.functional.mse_loss, feature_cols=["features"], label_cols=["y"],
                               batch_size=16, epochs=12, validation=0.2, store=store, random_seed=1,
                               run_id="linear", verbose=0, partitions_per_process=1)
    assert estimator.getBatchSize() == 16 and estimator.setEpochs(15).getEpochs() == 15
    df = linear_frame(spark)
    fitted = estimator.fit(df)

    history = fitted.getHistory()
    assert len(history["loss"]) == 15 and len(history["val_loss"]) == 15
    assert history["loss"][-1] < history["loss"][0] / 10 and history["val_loss"][-1] < 0.05
    assert store.exists(checkpoint_file(store, "linear"))
    checkpoint = torch.load(checkpoint_file(store, "linear"), weights_only=False)
    assert checkpoint["epoch"] == 14
    weights = fitted.getModel().weight.detach().numpy().ravel()
    np.testing.assert_allclose(weights, [2.0, -3.0], atol=0.2)

    predicted = fitted.transform(df).select("a", "b", "y", "y__output").toPandas()
    assert len(predicted) == 240
    np.testing.assert_allclose(predicted["y__output"], predicted["y"], atol=0.3)

    path = str(tmp_path / "saved-model")
    fitted.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    assert loaded.getHistory() == history and loaded.getFeatureColumns() == ["features"]
    again = loaded.transform(df).select("y__output").toPandas()
    np.testing.assert_allclose(again["y__output"], predicted["y__output"], rtol=1e-6)
    assert os.path.isdir(store.get_train_data_path("linear")) and os.path.isdir(store.get_val_data_path("linear"))


def test_estimator_errors_are_clear(spark, tmp_path):
    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator

    model = torch.nn.Linear(2, 1)
    with pytest.raises(TypeError, match="unknown parameters: bogus"):
        TorchEstimator(model=model, bogus=1)
    estimator = TorchEstimator(num_proc=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               loss=torch.nn.functional.mse_loss, label_cols=["y"], store=Store.create(str(tmp_path)))
    with pytest.raises(ValueError, match="feature_cols= is required"):
        estimator.fit(linear_frame(spark, 8))
    estimator.setFeatureCols(["nope"])
    with pytest.raises(ValueError, match="no column 'nope'"):
        estimator.fit(linear_frame(spark, 8))


def test_backend_runs_training_and_a_custom_backend_works(spark, tmp_path):
    """Horovod's idiom: `backend = SparkBackend(num_proc=..., stdout=..., ...)`, handed to the
    estimator; and a user's own `Backend` subclass that wraps it."""
    import io

    from horovod.spark.common.backend import Backend, SparkBackend
    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator

    class CountingBackend(Backend):
        def __init__(self, inner):
            self.inner, self.calls = inner, []

        def run(self, fn, args=(), kwargs={}, env=None):
            self.calls.append(env)
            return self.inner.run(fn, args=args, kwargs=kwargs, env={**(env or {}), "KHVD_CUSTOM": "1"})

        def num_processes(self):
            return self.inner.num_processes()

    out = io.StringIO()
    backend = CountingBackend(SparkBackend(num_proc=2, stdout=out, verbose=1))
    model = torch.nn.Linear(2, 1)
    estimator = TorchEstimator(backend=backend, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               loss=torch.nn.functional.mse_loss, feature_cols=["features"], label_cols=["y"],
                               store=Store.create(str(tmp_path)), epochs=2, batch_size=8, verbose=1,
                               partitions_per_process=1)
    fitted = estimator.fit(linear_frame(spark, 32))
    assert len(backend.calls) == 1 and len(fitted.getHistory()["loss"]) == 2
    assert "[0]<stdout>:epoch 2/2" in out.getvalue()  # the ranks' output went where SparkBackend was told

    with pytest.raises(ValueError, match='At most one of parameters "backend" and "num_proc"'):
        estimator.setNumProc(2).fit(linear_frame(spark, 8))
    with pytest.raises(TypeError, match="unknown arguments: bogus"):
        SparkBackend(num_proc=2, bogus=1)
    with pytest.raises(NotImplementedError, match="must implement run"):
        Backend().run(print)


class Heads(torch.nn.Module):
    """Five outputs, one per kind of label: the prediction columns take Horovod's types."""

    def forward(self, x):
        return x * 1.0, torch.relu(x), x[:, :1] * 2.6, x[:, :1] / 2, x.repeat(1, 2)


def test_transform_output_columns_take_the_types_horovod_gives_them(spark):
    """A dense/sparse vector label gets a vector of that kind, a numeric one its own type (an
    integer rounded), several values for a number a dense vector; names are <label>__output."""
    import sys

    import cloudpickle
    from pyspark.ml.linalg import DenseVector, SparseVector, Vectors, VectorUDT
    from pyspark.sql.types import FloatType, IntegerType

    from horovod.spark.torch import TorchModel

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    labels = ["dense", "sparse", "count", "ratio", "kind"]
    model = TorchModel(model=Heads(), feature_columns=["features"], label_columns=labels,
                       _metadata={"output_shapes": [(3,), (3,), (1,), (1,), (6,)], "input_shapes": None,
                                  "column_types": {"dense": "dense_vector", "sparse": "sparse_vector",
                                                   "count": "int", "ratio": "float", "kind": "double"}})
    df = spark.createDataFrame([(Vectors.dense([1.0, -2.0, 0.5]),), (Vectors.dense([-1.0, 3.0, 0.0]),)],
                               ["features"])
    out = model.transform(df)
    types = {field.name: type(field.dataType) for field in out.schema.fields}
    assert types == {"features": VectorUDT, "dense__output": VectorUDT, "sparse__output": VectorUDT,
                     "count__output": IntegerType, "ratio__output": FloatType, "kind__output": VectorUDT}
    first = out.collect()[0]
    assert isinstance(first["dense__output"], DenseVector) and list(first["dense__output"]) == [1.0, -2.0, 0.5]
    assert first["sparse__output"] == SparseVector(3, {0: 1.0, 2: 0.5})
    assert first["count__output"] == 3 and first["ratio__output"] == 0.5
    assert isinstance(first["kind__output"], DenseVector) and len(first["kind__output"]) == 6
    # A model saved before column types were kept: a number stays a double.
    legacy = model.copy()
    legacy._set(_metadata={"output_shapes": [(3,), (3,), (1,), (1,), (6,)], "input_shapes": None})
    assert dict(legacy.transform(df).dtypes)["count__output"] == "double"
