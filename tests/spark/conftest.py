"""A real Spark cluster for the tests of this folder: `local-cluster` mode, separate executor JVMs.

One session per test module (starting one takes tens of seconds); it is stopped at the module's
end, which stops its executors. Without pyspark or Java the tests are skipped, saying why (in CI they fail: tests/support/engines.py).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Iterator

import pytest

from engines import engine_unavailable


def spark_missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install 'khorovod[spark]')"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime (Spark needs one)"
    return None


def start_spark(executors: int = 2, cores: int = 1, app: str = "khorovod-tests",
                conf: dict[str, str] | None = None) -> "object":
    """A SparkSession on `executors` executor JVMs of `cores` task slots each, on loopback, with
    the Spark settings `conf` on top."""
    reason = spark_missing()
    if reason:
        engine_unavailable(reason)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = (builder.master(f"local-cluster[{executors},{cores},1024]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               # A barrier stage larger than the cluster fails after this many checks, not 40 x 15 s.
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "1")
               .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
               .getOrCreate())
    # Hence every executor must have registered before a test starts a barrier stage: on a loaded
    # machine the JVMs take longer than those two checks.
    status = session.sparkContext._jsc.sc().getExecutorMemoryStatus  # the driver, and each executor
    deadline = time.monotonic() + 180
    while status().size() < executors + 1:
        if time.monotonic() > deadline:
            engine_unavailable(f"only {status().size() - 1} of {executors} Spark executors registered within 180 s")
        time.sleep(0.2)
    return session


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    session = start_spark()
    try:
        yield session
    finally:
        session.stop()
