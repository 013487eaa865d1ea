"""Train a PyTorch Lightning module on a Spark DataFrame with Horovod, as a Spark ML estimator."""

from horovod.spark.lightning.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
