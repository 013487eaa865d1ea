"""One Lightning `Trainer.fit` on every rank, through the strategy the Spark estimators give their
Trainer, with the estimator's own Trainer arguments (`devices=1`, each rank its own share of the
data, so no sampler of Lightning's). `fit(accelerator)` is the rest of a `multirank.hvdrun`
snippet whose start defines `hvd`, `r`, `n`, `dev` (this rank's device) and `routes()`; each rank
reports the devices it trained on, its last logged loss (logged with `sync_dist=True`), some
weights, and the routes.
"""


def fit(accelerator: str) -> str:
    return _FIT.replace("ACCELERATOR", repr(accelerator))


def check(result, device: str, routes: dict) -> None:
    """Both ranks trained on `device` through `routes`, learned, and agree on the weights and
    the logged loss (`sync_dist=True` averaged it)."""
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["trained_on"] == [device], got  # Lightning moves the module back to the CPU after fit
        assert got["loss"] < 1.0, got  # the target's variance is 6: the model learned
        assert got["routes"] == routes, got["routes"]
    assert result.ranks[0]["weights"] == result.ranks[1]["weights"], result.ranks
    assert result.ranks[0]["loss"] == result.ranks[1]["loss"], result.ranks


_FIT = r'''
import importlib.util
import os
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

# The module alone: the package horovod.spark needs pyspark, which the GPU machine lacks.
spec = importlib.util.spec_from_file_location("strategy", os.path.join(os.path.dirname(hvd.__file__), "..",
                                                                       "spark", "lightning", "strategy.py"))
strategy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(strategy)
horovod_strategy = strategy.horovod_strategy


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(r)  # different on each rank: the strategy broadcasts rank 0's
        self.net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.trained_on = {str(p.device) for p in self.parameters()} | {str(x.device)}
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(1234)
x = torch.randn(256, 6)
y = x.sum(dim=1, keepdim=True)
data = DataLoader(TensorDataset(x[r::n], y[r::n]), batch_size=16)
model = Regression()
trainer = pl.Trainer(accelerator=ACCELERATOR, devices=1, strategy=horovod_strategy("lightning.pytorch", dev, None, None),
                     max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, use_distributed_sampler=False)
trainer.fit(model, data)
report(trained_on=sorted(model.trained_on), loss=float(trainer.callback_metrics["train_loss"]),
       weights=[round(v, 6) for p in model.parameters() for v in p.detach().cpu().flatten()[:3].tolist()],
       routes=routes())
'''
