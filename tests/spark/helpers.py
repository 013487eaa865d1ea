"""What several Spark test modules use: processes left behind, and a small regression DataFrame."""

from __future__ import annotations

import time

import numpy as np

from leftovers import processes_with_env


def workers_with(tag: str) -> list[int]:
    """Pids of processes (anywhere on this machine) started with KHVD_SPARK_TAG=tag."""
    return processes_with_env("KHVD_SPARK_TAG", tag)


def none_left(tag: str, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while workers_with(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    return workers_with(tag)


def linear_frame(spark, rows: int = 240):
    from pyspark.ml.feature import VectorAssembler

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(rows, 2))
    y = 2.0 * x[:, 0] - 3.0 * x[:, 1] + 1.0
    df = spark.createDataFrame([(float(a), float(b), float(t)) for (a, b), t in zip(x, y)], ["a", "b", "y"])
    return VectorAssembler(inputCols=["a", "b"], outputCol="features").transform(df)
