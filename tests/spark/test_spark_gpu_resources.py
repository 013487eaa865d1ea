"""`horovod.spark.task.get_available_devices` on a real local-cluster Spark that schedules GPUs.

The cluster's workers discover two fake GPUs through a discovery script (Spark only runs the
script and trusts its answer), and each task asks for one. The cluster needs Spark settings of its
own, fixed at start, so it runs in a process of its own (gpu_resources_job.py), not on the shared
session of conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.conftest import spark_missing
from engines import engine_unavailable

pytestmark = pytest.mark.timeout(400)  # a Spark JVM of its own: ~1 min idle, several under load

ROOT = Path(__file__).resolve().parents[2]


def test_each_worker_is_told_the_gpu_its_task_was_given(tmp_path):
    reason = spark_missing()
    if reason:
        engine_unavailable(reason)
    script = tmp_path / "discover_gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "tests" / "support"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tests.spark.gpu_resources_job", str(script)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=380)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(lines[0][len("RESULTS "):])
    assert [r["rank"] for r in results] == [0, 1]
    for result in results:  # one GPU per task, out of the two its executor discovered
        assert len(result["devices"]) == 1 and result["devices"][0] in {"0", "1"}, results


def test_without_gpu_scheduling_there_are_none(spark):
    import cloudpickle

    import horovod.spark
    from tests.spark import gpu_resources_job

    cloudpickle.register_pickle_by_value(gpu_resources_job)
    results = horovod.spark.run(gpu_resources_job.train, num_proc=2)
    assert [r["devices"] for r in results] == [[], []]
