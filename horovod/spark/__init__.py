"""Horovod on Spark: `run` a function as a Horovod job in Spark tasks, or `run_elastic` an elastic
one (the estimators live in `horovod.spark.torch`, `horovod.spark.keras`, `horovod.spark.lightning`
and `horovod.spark.common`)."""

from horovod.spark.elastic import run_elastic
from horovod.spark.runner import run

__all__ = ["run", "run_elastic"]
