"""Train a Keras model on a Spark DataFrame with Horovod, as a Spark ML estimator."""

from horovod.spark.keras.estimator import KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel"]
