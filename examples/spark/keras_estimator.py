"""KerasEstimator: fit a Keras classifier on a Spark DataFrame with Horovod, predict, save, load.

    python examples/spark/keras_estimator.py --num-proc 2 --store /tmp/khorovod-spark-keras-store

The data is generated: 2,000 random points (x1, x2) in the square [-1, 1]^2, labelled 1 inside
the circle of radius 0.7 and 0 outside; the model is a small two-layer network.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(spark: object, num_proc: int, store_path: str, epochs: int) -> float:
    import keras
    import numpy as np
    from pyspark.ml.feature import VectorAssembler

    from horovod.spark.common.store import Store
    from horovod.spark.keras import KerasEstimator, KerasModel

    rng = np.random.default_rng(0)
    points = rng.uniform(-1, 1, size=(2000, 2))
    inside = (points ** 2).sum(axis=1) < 0.49
    table = spark.createDataFrame([(float(x1), float(x2), float(label)) for (x1, x2), label in zip(points, inside)],
                                  ["x1", "x2", "label"])
    df = VectorAssembler(inputCols=["x1", "x2"], outputCol="features").transform(table)

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    estimator = KerasEstimator(num_proc=num_proc, store=Store.create(store_path), model=model,
                               optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy",
                               metrics=["accuracy"], feature_cols=["features"], label_cols=["label"],
                               batch_size=32, epochs=epochs, validation=0.1, random_seed=1,
                               partitions_per_process=2)
    fitted = estimator.fit(df)
    print("val_accuracy by epoch:", [round(v, 3) for v in fitted.getHistory()["val_accuracy"]])
    path = os.path.join(store_path, "fitted-model")
    fitted.write().overwrite().save(path)
    predictions = KerasModel.load(path).transform(df).select("x1", "x2", "label", "label__output")
    predictions.show(5)
    frame = predictions.toPandas()
    accuracy = float(((frame["label__output"] > 0.5) == (frame["label"] > 0.5)).mean())
    print(f"accuracy over {len(frame)} rows: {accuracy:.3f}")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default="/tmp/khorovod-spark-keras-store")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this one
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(args.master).appName("KerasEstimator example")
               .config("spark.ui.enabled", "false").getOrCreate())
    try:
        main(session, args.num_proc, args.store, args.epochs)
    finally:
        session.stop()
