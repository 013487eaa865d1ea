"""Horovod's "legacy" form of the Lightning estimator: a plain `torch.nn.Module` with the torch
estimator's `optimizer=`, `loss=` (or `loss_constructors=`), `loss_weights=` and
`sample_weight_col=`, trained by Lightning's `Trainer` all the same: it is wrapped in a
`lightning.pytorch.LightningModule` whose hooks are the torch estimator's steps.
"""

from __future__ import annotations

from typing import Any

from horovod.spark.torch.estimator import ModuleSteps, transform_outputs

#: The wrapped module's attribute name, the prefix of its weights in the wrapper's state dict.
WRAPPED = "wrapped"


def to_lightning_module(model: Any, steps: ModuleSteps) -> Any:
    """`model` inside a LightningModule: `configure_optimizers` rebuilds the estimator's optimizer
    on it, `training_step` returns the estimator's loss (logged as `train_loss`) and
    `validation_step` logs `val_loss`."""
    import lightning.pytorch as pl

    class LegacyModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            setattr(self, WRAPPED, model)

        def forward(self, *inputs: Any) -> Any:
            return getattr(self, WRAPPED)(*inputs)

        def configure_optimizers(self) -> Any:
            return steps.optimizer(getattr(self, WRAPPED))[0]

        def _loss(self, batch: dict[str, Any]) -> Any:
            inputs, labels, weights = steps.unpack(batch)
            outputs, labels = transform_outputs(self(*inputs), labels)
            return steps.loss(outputs, labels, weights)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            loss = self._loss(batch)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
            self.log("val_loss", self._loss(batch))

    return LegacyModule()
