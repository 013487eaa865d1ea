"""KerasEstimator end to end on the real Spark cluster: fit, transform, checkpoint, save and load."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(600)

keras = pytest.importorskip("keras")


def test_fit_transform_checkpoint_save_load(spark, tmp_path):
    from pyspark.ml.feature import VectorAssembler

    from horovod.spark.common.store import Store, checkpoint_file
    from horovod.spark.keras import KerasEstimator, KerasModel

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(200, 2))
    rows = [(float(a), float(b), float(2 * a - 3 * b + 1)) for a, b in x]
    df = VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(
        spark.createDataFrame(rows, ["a", "b", "y"]))
    store = Store.create(str(tmp_path / "store"))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    estimator = KerasEstimator(num_proc=2, model=model, optimizer=keras.optimizers.SGD(0.2), loss="mse",
                               feature_cols=["features"], label_cols=["y"], batch_size=16, epochs=15,
                               validation=0.2, store=store, random_seed=1, run_id="keras-linear",
                               partitions_per_process=1, verbose=0)
    fitted = estimator.fit(df)

    history = fitted.getHistory()
    assert len(history["loss"]) == 15 and len(history["val_loss"]) == 15
    assert history["loss"][-1] < history["loss"][0] / 10 and history["val_loss"][-1] < 0.05
    assert store.exists(checkpoint_file(store, "keras-linear"))
    kernel = fitted.getModel().layers[0].get_weights()[0].ravel()
    np.testing.assert_allclose(kernel, [2.0, -3.0], atol=0.2)

    predicted = fitted.transform(df).select("y", "y__output").toPandas()
    np.testing.assert_allclose(predicted["y__output"], predicted["y"], atol=0.3)
    path = str(tmp_path / "saved-model")
    fitted.write().overwrite().save(path)
    again = KerasModel.load(path).transform(df).select("y__output").toPandas()
    np.testing.assert_allclose(again["y__output"], predicted["y__output"], rtol=1e-5)


class Scale(keras.layers.Layer):
    """A layer of the user's own: the model loads only with custom_objects naming it."""

    def call(self, x):
        return x * 1.0


class EnvProbe(keras.callbacks.Callback):
    """Writes what the rank saw of backend_env."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_train_end(self, logs=None):
        import os

        import horovod.keras as hvd

        with open(os.path.join(self.directory, f"rank{hvd.rank()}"), "w") as f:
            f.write(os.environ.get("KHVD_BACKEND_ENV", "unset"))


def test_sample_weights_checkpoint_callback_custom_objects_compression_backend_env(spark, tmp_path):
    """Rows of weight 0 carry wrong labels; the best-model checkpoint is what the store keeps."""
    import sys

    import cloudpickle
    from pyspark.ml.feature import VectorAssembler

    import horovod.keras as hvd
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store, checkpoint_file
    from horovod.spark.keras import KerasEstimator

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, size=(200, 2))
    weight = (np.arange(200) % 2).astype(float)
    y = np.where(weight == 0, 40.0, 2 * x[:, 0] - 3 * x[:, 1] + 1)
    df = VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(
        spark.createDataFrame([(float(a), float(b), float(t), float(w)) for (a, b), t, w in zip(x, y, weight)],
                              ["a", "b", "y", "w"]))
    store = Store.create(str(tmp_path / "store"))
    probes = tmp_path / "probes"
    probes.mkdir()
    model = keras.Sequential([keras.Input((2,)), Scale(), keras.layers.Dense(1)])
    estimator = KerasEstimator(
        backend=SparkBackend(num_proc=2), model=model, optimizer=keras.optimizers.SGD(0.2), loss="mse",
        loss_weights=[1.0], feature_cols=["features"], label_cols=["y"], sample_weight_col="w", batch_size=16,
        epochs=12, validation=0.2, store=store, random_seed=1, run_id="keras-weighted", partitions_per_process=1,
        verbose=0, custom_objects={"Scale": Scale}, gradient_compression=hvd.Compression.fp16,
        checkpoint_callback=hvd.callbacks.BestModelCheckpoint(monitor="val_loss"),
        backend_env={"KHVD_BACKEND_ENV": "given"}, callbacks=[EnvProbe(str(probes))])
    fitted = estimator.fit(df)
    kernel = fitted.getModel().layers[-1].get_weights()[0].ravel()
    np.testing.assert_allclose(kernel, [2.0, -3.0], atol=0.3)
    assert sorted(p.name for p in probes.iterdir()) == ["rank0", "rank1"]
    assert {p.read_text() for p in probes.iterdir()} == {"given"}
    assert store.exists(checkpoint_file(store, "keras-weighted"))
    predicted = fitted.transform(df).select("y", "y__output", "w").toPandas()
    kept = predicted[predicted["w"] == 1]
    np.testing.assert_allclose(kept["y__output"], kept["y"], atol=0.4)

    # Saved and loaded back as a Spark ML model, it keeps its custom layer (custom_objects).
    from horovod.spark.keras import KerasModel

    path = str(tmp_path / "saved-model")
    fitted.write().overwrite().save(path)
    loaded = KerasModel.load(path)
    assert list(loaded.getCustomObjects()) == ["Scale"]  # the class travels by value, as to the ranks
    assert [type(layer).__name__ for layer in loaded.getModel().layers] == ["Scale", "Dense"]
    again = loaded.transform(df).select("y__output").toPandas()
    np.testing.assert_allclose(again["y__output"], predicted["y__output"], rtol=1e-5)
