"""Lightning on Spark: fit a LightningModule with `horovod.spark.lightning.TorchEstimator`,
Lightning's own Trainer in every rank (callbacks, checkpoint, early stopping), then predict.

    python examples/spark/lightning_estimator.py --num-proc 2 --store /tmp/khorovod-spark-lightning-store

The data is generated: MNIST in miniature, 1,200 images of 4x4 pixels in three classes (bright
in the top, middle or bottom rows), as a Spark ML vector column and a numeric label.
"""

from __future__ import annotations

import argparse
import os
import sys


def digits(spark: object, rows: int) -> object:
    import numpy as np
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, rows)
    images = rng.uniform(0.0, 0.25, size=(rows, 4, 4))
    for image, label in zip(images, labels):
        image[label:label + 2] += 0.7
    return spark.createDataFrame([(Vectors.dense(image.ravel()), float(label))
                                  for image, label in zip(images, labels)], ["features", "label"])


def main(spark: object, num_proc: int, store_path: str, epochs: int) -> float:
    import numpy as np
    import pyspark.sql.types as T
    import torch
    import torch.nn.functional as F
    from lightning.pytorch import Callback, LightningModule
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.sql.functions import udf

    import horovod.spark.lightning as hvd
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store

    class Net(LightningModule):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 4, kernel_size=3, padding=1)
            self.fc = torch.nn.Linear(64, 3)

        def forward(self, x):
            x = x.float().reshape((-1, 1, 4, 4))
            return F.log_softmax(self.fc(F.relu(self.conv(x)).flatten(1)), -1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.5)

        def training_step(self, batch, batch_idx):
            loss = F.nll_loss(self(batch["features"]), batch["label"].long())
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", F.nll_loss(self(batch["features"]), batch["label"].long()))

    class EpochEnd(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.global_rank == 0:
                print(f"epoch {trainer.current_epoch} ended: val_loss={float(trainer.callback_metrics['val_loss']):.4f}")

    df = digits(spark, 1200)
    train_df, test_df = df.randomSplit([0.9, 0.1], seed=1)
    store = Store.create(store_path)
    backend = SparkBackend(num_proc=num_proc, stdout=sys.stdout, stderr=sys.stderr)
    estimator = hvd.TorchEstimator(
        backend=backend, store=store, model=Net(), input_shapes=[[-1, 1, 4, 4]], feature_cols=["features"],
        label_cols=["label"], batch_size=32, epochs=epochs, validation=0.1, verbose=0, random_seed=1,
        callbacks=[EpochEnd(), ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1),
                   EarlyStopping(monitor="val_loss", min_delta=0.001, patience=3, mode="min")])
    torch_model = estimator.fit(train_df).setOutputCols(["label_prob"])
    print("checkpoints:", store.get_checkpoints(torch_model.getRunId()))

    pred_df = torch_model.transform(test_df)
    argmax = udf(lambda v: float(np.argmax(v.toArray())), returnType=T.DoubleType())
    pred_df = pred_df.withColumn("label_pred", argmax(pred_df.label_prob))
    evaluator = MulticlassClassificationEvaluator(predictionCol="label_pred", labelCol="label", metricName="accuracy")
    accuracy = evaluator.evaluate(pred_df)
    print("Test accuracy:", accuracy)
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--store", default="/tmp/khorovod-spark-lightning-store")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the executors' Python: this one
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(args.master).appName("Lightning TorchEstimator example")
               .config("spark.ui.enabled", "false").getOrCreate())
    try:
        main(session, args.num_proc, args.store, args.epochs)
    finally:
        session.stop()
