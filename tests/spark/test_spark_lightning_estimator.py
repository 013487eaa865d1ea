"""horovod.spark.lightning end to end on the real Spark cluster, in the idiom of Horovod's
`pytorch_lightning_spark_mnist.py`: Lightning's own Trainer runs in every rank with our Horovod
strategy; callbacks, ModelCheckpoint into the store, a logger writing to the store, resuming,
several optimizers, trainer_args, profiler, terminate_on_nan, loader_num_epochs, data_module and
a module from the `pytorch_lightning` package."""

from __future__ import annotations

import io
import os
import re
import sys

import cloudpickle
import numpy as np
import pytest

pytestmark = pytest.mark.timeout(900)

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch", reason="pip install 'khorovod[spark,lightning]' brings lightning")
pl_classic = pytest.importorskip("pytorch_lightning", reason="pip install 'khorovod[spark,lightning]' brings it")

from lightning.pytorch import Callback, LightningModule  # noqa: E402

from tests.spark.helpers import linear_frame  # noqa: E402

# The classes below travel to the executors by value: they cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Net(LightningModule):
    """Horovod's example's shape: forward reshapes, training_step logs train_loss, validation_step val_loss."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.layer(x.float().reshape(-1, 2))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self(batch["features"]).view(-1), batch["y"])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self(batch["features"]).view(-1), batch["y"]))

    def on_train_end(self):
        import horovod.torch as hvd

        sums = hvd.allgather_object(round(float(sum(p.detach().sum() for p in self.parameters())), 6))
        print(f"parameter sums by rank: {sums}", flush=True)


class EpochCounter(Callback):
    """Prints what the Trainer of each rank is and does (the test reads the ranks' output)."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_start(self, trainer, pl_module):
        print(f"trainer: {type(trainer).__module__} strategy={type(trainer.strategy).__name__} "
              f"rank={trainer.global_rank}/{trainer.world_size} log_every_n_steps={trainer.log_every_n_steps} "
              f"accumulate={trainer.accumulate_grad_batches} max_epochs={trainer.max_epochs}", flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def on_train_epoch_end(self, trainer, pl_module):
        print(f"rank {trainer.global_rank}: train epoch {trainer.current_epoch} ended after {self.batches} batches",
              flush=True)
        self.batches = 0


def _estimator(store, backend, **kwargs):
    from horovod.spark.lightning import TorchEstimator

    settings = dict(backend=backend, store=store, model=Net(), input_shapes=[[-1, 2]], feature_cols=["features"],
                    label_cols=["y"], batch_size=16, epochs=8, validation=0.2, verbose=1, random_seed=1,
                    partitions_per_process=1)
    settings.update(kwargs)
    return TorchEstimator(**settings)


def _backend(output):
    from horovod.spark.common.backend import SparkBackend

    return SparkBackend(num_proc=2, stdout=output, stderr=output, prefix_output_with_timestamp=True)


def test_horovod_example_flow_checkpoint_logger_resume_transform(spark, tmp_path, capsys):
    from lightning.pytorch.callbacks import EarlyStopping
    from lightning.pytorch.callbacks.model_checkpoint import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from horovod.spark.common.store import Store
    from horovod.spark.lightning import TorchModel

    store = Store.create(str(tmp_path / "store"))
    output = io.StringIO()
    callbacks = [EpochCounter(), ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1, verbose=True),
                 EarlyStopping(monitor="val_loss", min_delta=0.001, patience=3, verbose=True, mode="min")]
    estimator = _estimator(store, _backend(output), callbacks=callbacks, logger=CSVLogger("ignored"),
                           run_id="example", log_every_n_steps=2)
    df = linear_frame(spark)
    fitted = estimator.fit(df).setOutputCols(["y_pred"])
    text = output.getvalue()

    assert isinstance(fitted, TorchModel)
    assert re.search(r"trainer: lightning\.pytorch\.trainer\.trainer strategy=HorovodStrategy rank=0/2 "
                     r"log_every_n_steps=2 accumulate=1 max_epochs=8", text), text[-3000:]
    assert "rank=1/2" in text
    # Each rank trained on its own rows; the averaged gradients kept the weights identical.
    sums = re.findall(r"parameter sums by rank: \[([-\d., ]+)\]", text)
    assert sums and all(len(set(found.split(", "))) == 1 for found in sums), (sums, text[-4000:])
    # The ranks agree on every batch and on when EarlyStopping stops.
    ended = {rank: re.findall(rf"rank {rank}: train epoch (\d+) ended after (\d+) batches", text) for rank in (0, 1)}
    assert ended[0] == ended[1] and 3 <= len(ended[0]) <= 8, (ended, text[-4000:])
    history = fitted.getHistory()
    assert set(history) == {"train_loss", "val_loss"} and history["val_loss"] < 0.05, (history, text[-4000:])
    np.testing.assert_allclose(fitted.getModel().layer.weight.detach().numpy().ravel(), [2.0, -3.0], atol=0.2,
                               err_msg=text[-4000:])

    checkpoints = store.get_checkpoints("example")
    assert [os.path.basename(path) for path in checkpoints] == ["checkpoint.ckpt"]
    saved = torch.load(checkpoints[0], weights_only=False)
    assert saved["epoch"] <= int(ended[0][-1][0]) and "state_dict" in saved and saved["optimizer_states"]
    metrics = list((tmp_path / "store" / "runs" / "example" / "logs").rglob("metrics.csv"))
    assert metrics and "val_loss" in metrics[0].read_text()

    predicted = fitted.transform(df).select("y", "y_pred").toPandas()
    np.testing.assert_allclose(predicted["y_pred"], predicted["y"], atol=0.3)
    path = str(tmp_path / "saved-model")
    fitted.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    assert loaded.getHistory() == history
    np.testing.assert_allclose(loaded.setOutputCols(["y_pred"]).transform(df).select("y_pred").toPandas()["y_pred"],
                               predicted["y_pred"], rtol=1e-5, atol=1e-6)

    # The same run_id resumes from its checkpoint (the best epoch's): the epochs after it, to 10.
    capsys.readouterr()
    output = io.StringIO()
    _estimator(store, _backend(output), callbacks=[EpochCounter()], run_id="example", epochs=10).fit(df)
    assert f"Resuming training from last checkpoint: {checkpoints[0]}" in capsys.readouterr().out
    resumed = re.findall(r"rank 0: train epoch (\d+) ended", output.getvalue())
    assert resumed == [str(epoch) for epoch in range(saved["epoch"] + 1, 10)], (saved["epoch"], output.getvalue()[-4000:])
    assert torch.load(checkpoints[0], weights_only=False)["epoch"] == 9


class TwoOptimizers(pl_classic.LightningModule):
    """A `pytorch_lightning` module with manual optimization over two optimizers."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.weights = torch.nn.Linear(2, 1, bias=False)
        self.bias = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return self.weights(x.float().reshape(-1, 2)).view(-1) + self.bias

    def configure_optimizers(self):
        return [torch.optim.SGD(self.weights.parameters(), lr=0.1), torch.optim.Adam([self.bias], lr=0.05)]

    def training_step(self, batch, batch_idx):
        first, second = self.optimizers()
        first.zero_grad()
        second.zero_grad()
        loss = torch.nn.functional.mse_loss(self(batch["features"]), batch["y"])
        self.manual_backward(loss)
        first.step()
        second.step()
        self.log("train_loss", loss)

    on_train_end = Net.on_train_end


class ClassicEpochCounter(pl_classic.Callback):
    on_train_start = EpochCounter.on_train_start
    on_train_epoch_end = EpochCounter.on_train_epoch_end

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1


def test_pytorch_lightning_module_two_optimizers_trainer_args_profiler_loader_epochs(spark, tmp_path):
    from horovod.spark.common.store import Store

    store = Store.create(str(tmp_path / "store"))
    output = io.StringIO()
    estimator = _estimator(store, _backend(output), model=TwoOptimizers(), callbacks=[ClassicEpochCounter()],
                           validation=None, epochs=5, trainer_args={"max_epochs": 4}, profiler="simple",
                           loader_num_epochs=2, train_async_data_loader_queue_size=2, run_id="two")
    fitted = estimator.fit(linear_frame(spark))
    text = output.getvalue()

    assert re.search(r"trainer: pytorch_lightning\.trainer\.trainer strategy=HorovodStrategy rank=0/2 "
                     r"log_every_n_steps=50 accumulate=1 max_epochs=4", text), text[-3000:]
    sums = re.findall(r"parameter sums by rank: \[([-\d., ]+)\]", text)
    assert sums and all(len(set(found.split(", "))) == 1 for found in sums), sums
    # loader_num_epochs=2: the loader passes over the 240 rows twice (15 batches of 16 on each of
    # the 2 ranks), then has no more to give: 8 batches, 7, then none.
    batches = [int(n) for n in re.findall(r"rank 1: train epoch \d+ ended after (\d+) batches", text)]
    assert batches == [8, 7, 0, 0], text[-3000:]
    assert np.isfinite(fitted.getHistory()["train_loss"])
    assert list((tmp_path / "store" / "runs" / "two" / "logs").glob("*profile*.txt")), \
        sorted(map(str, (tmp_path / "store" / "runs" / "two").rglob("*")))


class NaNAfterTwo(Net):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step >= 2 else loss


class ParquetRows(pl.LightningDataModule):
    """A user's data module: Horovod's arguments in, this rank's rows of the Parquet files out."""

    def __init__(self, train_dir, cur_shard, shard_count, schema_fields, train_batch_size, storage_options,
                 **others) -> None:
        super().__init__()
        self.train_dir, self.shard, self.shards, self.columns = train_dir, cur_shard, shard_count, schema_fields
        self.batch_size, self.storage_options = train_batch_size, storage_options
        print(f"data module: shard {cur_shard} of {shard_count}, columns {schema_fields}, "
              f"has_val={others['has_val']}, steps {others['steps_per_epoch_train']}", flush=True)

    def train_dataloader(self):
        import fsspec
        import pyarrow.dataset as ds

        fs, path = fsspec.core.url_to_fs(self.train_dir, **self.storage_options)
        table = ds.dataset(path, format="parquet", filesystem=fs).to_table(columns=self.columns).to_pydict()
        count = len(table["y"]) // self.shards
        rows = [{"features": torch.tensor(f, dtype=torch.float32), "y": torch.tensor(y, dtype=torch.float32)}
                for f, y in zip(table["features"][self.shard::self.shards][:count],
                                table["y"][self.shard::self.shards][:count])]
        return torch.utils.data.DataLoader(rows, batch_size=self.batch_size)


def test_data_module_accumulation_legacy_module_and_terminate_on_nan(spark, tmp_path):
    from horovod.spark.common.store import Store

    store = Store.create(str(tmp_path / "store"))
    output = io.StringIO()
    fitted = _estimator(store, _backend(output), model=Net(lr=0.2), data_module=ParquetRows, validation=None,
                        epochs=6, backward_passes_per_step=2, callbacks=[EpochCounter()]).fit(linear_frame(spark))
    text = output.getvalue()
    assert "data module: shard 1 of 2, columns ['features', 'y'], has_val=False, steps 8" in text, text[-3000:]
    assert "accumulate=2" in text
    batches = set(re.findall(r"rank 0: train epoch \d+ ended after (\d+) batches", text))
    assert batches == {"8"}, text[-3000:]  # 120 rows per rank, 16 a batch: the data module's own loader
    np.testing.assert_allclose(fitted.getModel().layer.weight.detach().numpy().ravel(), [2.0, -3.0], atol=0.3)

    # Horovod's legacy form: a plain nn.Module with optimizer= and loss= trains through Lightning too.
    plain = torch.nn.Linear(2, 1)
    legacy = _estimator(store, _backend(io.StringIO()), model=plain, optimizer=torch.optim.SGD(plain.parameters(), lr=0.1),
                        loss=torch.nn.functional.mse_loss, epochs=8).fit(linear_frame(spark))
    assert isinstance(legacy.getModel(), torch.nn.Linear) and set(legacy.getHistory()) == {"train_loss", "val_loss"}
    np.testing.assert_allclose(legacy.getModel().weight.detach().numpy().ravel(), [2.0, -3.0], atol=0.3)
    predicted = legacy.transform(linear_frame(spark)).select("y", "y__output").toPandas()
    np.testing.assert_allclose(predicted["y__output"], predicted["y"], atol=0.4)

    nan = _estimator(store, _backend(io.StringIO()), model=NaNAfterTwo(), terminate_on_nan=True, epochs=2)
    with pytest.raises(RuntimeError, match=r"ValueError: The loss returned in `training_step` is nan"):
        nan.fit(linear_frame(spark, 64))


def test_parameters_lightning_refuses_or_warns_and_min_pl_version(spark, tmp_path):
    import warnings

    from packaging.version import Version

    from horovod.spark.common.store import Store
    from horovod.spark.lightning import TorchEstimator
    from horovod.spark.lightning.estimator import MIN_PL_VERSION

    assert Version(pl.__version__) >= Version(MIN_PL_VERSION)
    store = Store.create(str(tmp_path))
    df = linear_frame(spark, 8)
    not_a_module = TorchEstimator(num_proc=2, model="a model", feature_cols=["features"], label_cols=["y"],
                                  store=store)
    with pytest.raises(TypeError, match="model= must be a LightningModule .*; got str"):
        not_a_module.fit(df)
    plain = TorchEstimator(num_proc=2, model=torch.nn.Linear(2, 1), feature_cols=["features"], label_cols=["y"],
                           store=store)
    with pytest.raises(ValueError, match="optimizer= is required"):
        plain.fit(df)
    model = Net()
    with_optimizer = TorchEstimator(num_proc=2, model=model, feature_cols=["features"], label_cols=["y"], store=store,
                                    optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="Parameter `optimizer` cannot be specified with a `LightningModule`"):
        with_optimizer.fit(df)

    estimator = TorchEstimator(num_proc=2, model=Net(), feature_cols=["nope"], label_cols=["y"], store=store,
                               metrics=[torch.nn.functional.l1_loss], trainer_args={"max_epochs": 3})
    assert estimator.getTrainerArgs() == {"max_epochs": 3} and estimator.getLogEveryNSteps() == 50
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="no column 'nope'"):
        warnings.simplefilter("always")
        estimator.fit(df)
    messages = " ".join(str(w.message) for w in caught)
    assert "metrics= has no effect here" in messages and "trainer_args" not in messages
