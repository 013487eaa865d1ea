"""Horovod's Spark estimator flows on the real local-cluster Spark, written as Horovod's docs and
examples write them: a backend and a store, `input_shapes` for image rows (MNIST-style), a
validation split, callbacks, reader parameters, sample weights (Rossmann-style regression), a
custom Backend, checkpoints and a resumed fit."""

from __future__ import annotations

import json
import os
import sys
import warnings

import cloudpickle
import numpy as np
import pytest

pytestmark = pytest.mark.timeout(900)

torch = pytest.importorskip("torch")

# Classes defined here travel to the executors by value: they cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def digits_frame(spark, rows: int = 160):
    """MNIST in miniature: 4x4 images (pixels 0..255) of two classes, bright at the top (0) or the
    bottom (1), as a Spark ML vector column `features` and an integer `label`."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, rows)
    images = rng.uniform(0, 60, size=(rows, 4, 4))
    for image, label in zip(images, labels):
        image[2 * label:2 * label + 2] += 180
    return spark.createDataFrame([(Vectors.dense(image.ravel()), int(label)) for image, label in zip(images, labels)],
                                 ["features", "label"])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.fc = torch.nn.Linear(64, 2)

    def forward(self, x):
        return torch.nn.functional.log_softmax(self.fc(torch.relu(self.conv(x)).flatten(1)), dim=1)


class EpochFiles:
    """A callback with Keras's hooks: each rank writes a file per epoch it finished."""

    def __init__(self, directory):
        self.directory = directory

    def on_epoch_end(self, epoch, logs=None):
        import horovod.torch as hvd

        with open(os.path.join(self.directory, f"rank{hvd.rank()}-epoch{epoch}.json"), "w") as f:
            json.dump(logs, f)


def test_mnist_style_flow_with_backend_input_shapes_callbacks_readers_and_resume(spark, tmp_path, capsys):
    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store, checkpoint_file
    from horovod.spark.torch import TorchEstimator

    def scale_pixels(frame):  # Petastorm's TransformSpec idiom: a pandas DataFrame in, one out
        frame["features"] = [np.asarray(v) / 255.0 for v in frame["features"]]
        return frame

    store = Store.create(str(tmp_path / "store"))
    backend = SparkBackend(num_proc=2, stdout=sys.stdout, stderr=sys.stderr, prefix_output_with_timestamp=True)
    callbacks_dir = tmp_path / "callbacks"
    callbacks_dir.mkdir()
    model = Net()
    estimator = TorchEstimator(
        backend=backend, store=store, model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05),
        loss=lambda input, target: torch.nn.functional.nll_loss(input, target.long()),
        input_shapes=[[-1, 1, 4, 4]], feature_cols=["features"], label_cols=["label"], validation=0.25,
        batch_size=16, epochs=4, verbose=1, random_seed=3, run_id="mnist", partitions_per_process=2,
        callbacks=[EpochFiles(str(callbacks_dir))], transformation_fn=scale_pixels,
        reader_pool_type="thread", train_reader_num_workers=2, val_reader_num_workers=1,
        inmemory_cache_all=True, shuffle_buffer_size=16)
    df = digits_frame(spark)
    fitted = estimator.fit(df)
    first = fitted.getHistory()
    assert len(first["loss"]) == 4 and first["val_loss"][-1] < first["val_loss"][0]
    assert sorted(os.listdir(callbacks_dir)) == [f"rank{r}-epoch{e}.json" for r in (0, 1) for e in range(4)]
    assert "val_loss" in json.loads((callbacks_dir / "rank1-epoch3.json").read_text())
    assert store.exists(checkpoint_file(store, "mnist"))

    # transform: rows reshaped by input_shapes on the executors, Horovod's <label>__output column.
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    scaled = df.select(F.transform(vector_to_array("features"), lambda v: v / 255.0).alias("features"), "label")
    predicted = fitted.transform(scaled).toPandas()
    assert dict(fitted.transform(scaled).dtypes)["label__output"] == "vector"  # class scores: a DenseVector
    accuracy = np.mean([np.argmax(out.toArray()) == label
                        for out, label in zip(predicted["label__output"], predicted["label"])])
    assert accuracy > 0.9

    # The same run_id again resumes from the run's checkpoint: it starts where the first fit ended.
    capsys.readouterr()
    resumed = estimator.setEpochs(1).fit(df).getHistory()
    assert "Resuming training from last checkpoint" in capsys.readouterr().out
    assert resumed["loss"][0] < first["loss"][0] / 2


def test_rossmann_style_regression_with_sample_weights_loss_constructors_and_accumulation(spark, tmp_path):
    """Rows of weight 0 carry wrong labels: with sample_weight_col they cannot pull the fit away."""
    from pyspark.ml.feature import VectorAssembler

    from horovod.spark.common.backend import SparkBackend
    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator

    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, size=(240, 2))
    sales = 2.0 * x[:, 0] - 3.0 * x[:, 1] + 1.0
    weight = (np.arange(240) % 2).astype(float)
    sales = np.where(weight == 0, 50.0, sales)
    rows = [(float(a), float(b), float(s), float(w)) for (a, b), s, w in zip(x, sales, weight)]
    df = VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(
        spark.createDataFrame(rows, ["a", "b", "sales", "weight"]))

    calls = []

    def minibatch_fn():
        def train_minibatch(model, optimizer, transform_outputs, loss_fn, inputs, labels, sample_weights):
            optimizer.zero_grad()
            outputs, labels = transform_outputs(model(*inputs), labels)
            loss = loss_fn(outputs, labels, sample_weights)
            loss.backward()
            optimizer.step()
            return outputs, loss
        calls.append(1)  # on the driver nothing runs: this only shows the function travels
        return train_minibatch

    model = torch.nn.Linear(2, 1)
    estimator = TorchEstimator(
        backend=SparkBackend(num_proc=2), store=Store.create(str(tmp_path / "store")), model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.2), loss_constructors=[lambda: torch.nn.functional.mse_loss],
        feature_cols=["features"], label_cols=["sales"], sample_weight_col="weight", batch_size=16, epochs=15,
        verbose=0, random_seed=1, partitions_per_process=1, train_minibatch_fn=minibatch_fn, reader_pool_type="dummy")
    fitted = estimator.fit(df)
    np.testing.assert_allclose(fitted.getModel().weight.detach().numpy().ravel(), [2.0, -3.0], atol=0.25)
    np.testing.assert_allclose(fitted.getModel().bias.item(), 1.0, atol=0.25)

    # Accumulating two batches per step (backward_passes_per_step) still fits.
    model = torch.nn.Linear(2, 1)
    fitted = TorchEstimator(
        num_proc=2, store=Store.create(str(tmp_path / "store2")), model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.2), loss=torch.nn.functional.mse_loss,
        feature_cols=["features"], label_cols=["sales"], sample_weight_col="weight", batch_size=8, epochs=15,
        verbose=0, random_seed=1, partitions_per_process=1, backward_passes_per_step=2).fit(df)
    np.testing.assert_allclose(fitted.getModel().weight.detach().numpy().ravel(), [2.0, -3.0], atol=0.25)
    with pytest.raises(ValueError, match="only one of loss_constructors and loss"):
        TorchEstimator(loss=torch.nn.functional.mse_loss, loss_constructors=[lambda: None])


def test_parameters_that_cannot_mean_the_same_warn(spark, tmp_path):
    from horovod.spark.common.store import Store
    from horovod.spark.torch import TorchEstimator

    model = torch.nn.Linear(2, 1)
    estimator = TorchEstimator(num_proc=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               loss=torch.nn.functional.mse_loss, feature_cols=["nope"], label_cols=["y"],
                               store=Store.create(str(tmp_path)), compress_sparse_cols=True, data_module=object)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="no column 'nope'"):
        warnings.simplefilter("always")
        estimator.fit(spark.createDataFrame([(1.0,)], ["y"]))
    messages = [str(w.message) for w in caught]
    assert any("compress_sparse_cols= has no effect here: SparseVector columns are always written dense" in m
               for m in messages)
    assert any("data_module= has no effect here" in m for m in messages)
