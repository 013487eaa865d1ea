"""horovod.spark.lightning end to end on the real Spark cluster: a LightningModule's own
configure_optimizers/training_step/validation_step train it; fit, transform, save and load."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

pytestmark = pytest.mark.timeout(600)

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch", reason="pip install 'khorovod[spark,lightning]' brings lightning")

from tests.spark.helpers import linear_frame  # noqa: E402

# The module below travels to the executors by value: they cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Linear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, features):
        return self.layer(features)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self(batch["features"]).view(-1), batch["y"])
        self.log("train_mae", (self(batch["features"]).view(-1) - batch["y"]).abs().mean())
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self(batch["features"]).view(-1), batch["y"]))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.2)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 10, 0.5)}


def test_fit_transform_checkpoint_save_load(spark, tmp_path):
    from horovod.spark.common.store import Store, checkpoint_file
    from horovod.spark.lightning import TorchEstimator, TorchModel

    store = Store.create(str(tmp_path / "store"))
    estimator = TorchEstimator(num_proc=2, model=Linear(), feature_cols=["features"], label_cols=["y"],
                               batch_size=16, epochs=15, validation=0.2, store=store, random_seed=1,
                               run_id="lightning", verbose=0, partitions_per_process=1)
    df = linear_frame(spark)
    fitted = estimator.fit(df)
    assert isinstance(fitted, TorchModel)

    history = fitted.getHistory()
    assert sorted(history) == ["loss", "train_mae", "val_loss"]
    assert all(len(values) == 15 for values in history.values())
    assert history["loss"][-1] < history["loss"][0] / 10 and history["val_loss"][-1] < 0.05
    assert history["train_mae"][-1] < history["train_mae"][0]
    checkpoint = torch.load(checkpoint_file(store, "lightning"), weights_only=False)
    assert checkpoint["epoch"] == 14
    assert checkpoint["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.1)  # StepLR halved it at epoch 10
    weights = fitted.getModel().layer.weight.detach().numpy().ravel()
    np.testing.assert_allclose(weights, [2.0, -3.0], atol=0.2)

    predicted = fitted.transform(df).select("y", "y__output").toPandas()
    assert len(predicted) == 240
    np.testing.assert_allclose(predicted["y__output"], predicted["y"], atol=0.3)

    path = str(tmp_path / "saved-model")
    fitted.write().overwrite().save(path)
    loaded = TorchModel.load(path)
    assert isinstance(loaded.getModel(), pl.LightningModule) and loaded.getHistory() == history
    again = loaded.transform(df).select("y__output").toPandas()
    np.testing.assert_allclose(again["y__output"], predicted["y__output"], rtol=1e-6)


def test_not_a_lightning_module_or_trainer_only_parameters_are_refused(spark, tmp_path):
    from horovod.spark.common.store import Store
    from horovod.spark.lightning import TorchEstimator

    store = Store.create(str(tmp_path))
    plain = TorchEstimator(num_proc=2, model=torch.nn.Linear(2, 1), feature_cols=["features"], label_cols=["y"],
                           store=store)
    with pytest.raises(TypeError, match="model= must be a lightning.pytorch.LightningModule, got Linear"):
        plain.fit(linear_frame(spark, 8))
    with_loss = TorchEstimator(num_proc=2, model=Linear(), feature_cols=["features"], label_cols=["y"],
                               store=store, loss=torch.nn.functional.mse_loss)
    with pytest.raises(NotImplementedError, match="loss= is not supported"):
        with_loss.fit(linear_frame(spark, 8))


def test_trainer_parameters_warn_and_min_pl_version(spark, tmp_path):
    import warnings

    from horovod.spark.common.store import Store
    from horovod.spark.lightning import TorchEstimator
    from horovod.spark.lightning.estimator import MIN_PL_VERSION

    from packaging.version import Version

    assert Version(pl.__version__) >= Version(MIN_PL_VERSION)
    estimator = TorchEstimator(num_proc=2, model=Linear(), feature_cols=["nope"], label_cols=["y"],
                               store=Store.create(str(tmp_path)), trainer_args={"max_epochs": 3}, log_every_n_steps=5)
    assert estimator.getTrainerArgs() == {"max_epochs": 3} and estimator.getLogEveryNSteps() == 5
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ValueError, match="no column 'nope'"):
        warnings.simplefilter("always")
        estimator.fit(linear_frame(spark, 8))
    messages = " ".join(str(w.message) for w in caught)
    assert "trainer_args= has no effect here" in messages and "log_every_n_steps= has no effect here" in messages
