"""TorchEstimator: fit a PyTorch model on a Spark DataFrame with Horovod, predict, save, load.

    python examples/spark/torch_estimator.py --num-proc 2 --store /tmp/khorovod-spark-store

The data is generated: y = 2a - 3b + 1 over 1,000 random points (a, b), as a vector column.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(spark: object, num_proc: int, store_path: str, epochs: int) -> float:
    import numpy as np
    import torch
    from pyspark.ml.feature import VectorAssembler

    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator, TorchModel

    rng = np.random.default_rng(0)
    points = rng.uniform(-1, 1, size=(1000, 2))
    rows = [(float(a), float(b), float(2 * a - 3 * b + 1)) for a, b in points]
    df = VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(
        spark.createDataFrame(rows, ["a", "b", "y"]))

    model = torch.nn.Linear(2, 1)
    estimator = TorchEstimator(num_proc=num_proc, store=Store.create(store_path), model=model,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               loss=torch.nn.functional.mse_loss, feature_cols=["features"], label_cols=["y"],
                               batch_size=32, epochs=epochs, validation=0.1, partitions_per_process=2)
    fitted = estimator.fit(df)
    print("val_loss by epoch:", [round(v, 5) for v in fitted.getHistory()["val_loss"]])
    path = os.path.join(store_path, "fitted-model")
    fitted.write().overwrite().save(path)
    predictions = TorchModel.load(path).transform(df).select("a", "b", "y", "y__output")
    predictions.show(5)
    error = float(predictions.toPandas().eval("abs(y - y__output)").max())
    print(f"largest error over {predictions.count()} rows: {error:.4f}")
    return error


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default="/tmp/khorovod-spark-store")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this one
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(args.master).appName("TorchEstimator example")
               .config("spark.ui.enabled", "false").getOrCreate())
    try:
        main(session, args.num_proc, args.store, args.epochs)
    finally:
        session.stop()
