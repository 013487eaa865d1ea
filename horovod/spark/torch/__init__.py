"""Train a PyTorch model on a Spark DataFrame with Horovod, as a Spark ML estimator."""

from horovod.spark.torch.estimator import TorchEstimator, TorchModel

__all__ = ["TorchEstimator", "TorchModel"]
