"""Horovod on Spark: `run` a function as a Horovod job in Spark tasks (the estimators live in
`horovod.spark.torch`, `horovod.spark.keras` and `horovod.spark.common`)."""

from horovod.spark.runner import run, run_elastic

__all__ = ["run", "run_elastic"]
