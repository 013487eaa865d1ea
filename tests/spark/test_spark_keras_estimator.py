"""KerasEstimator end to end on the real Spark cluster: fit, transform, checkpoint, save and load."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(600)

keras = pytest.importorskip("keras")


def test_fit_transform_checkpoint_save_load(spark, tmp_path):
    from pyspark.ml.feature import VectorAssembler

    from horovod.spark.common.store import Store
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
    assert store.exists(store.get_checkpoint_path("keras-linear"))
    kernel = fitted.getModel().layers[0].get_weights()[0].ravel()
    np.testing.assert_allclose(kernel, [2.0, -3.0], atol=0.2)

    predicted = fitted.transform(df).select("y", "y__output").toPandas()
    np.testing.assert_allclose(predicted["y__output"], predicted["y"], atol=0.3)
    path = str(tmp_path / "saved-model")
    fitted.write().overwrite().save(path)
    again = KerasModel.load(path).transform(df).select("y__output").toPandas()
    np.testing.assert_allclose(again["y__output"], predicted["y__output"], rtol=1e-5)
