"""Run as a script by test_spark_gpu_resources.py, in a process of its own: a local-cluster Spark
whose workers discover fake GPUs (the discovery script given as argv[1] reports addresses "0" and
"1"), each task asking for one; prints the GPU addresses each rank's worker was told, as JSON."""

from __future__ import annotations

import json
import sys

from tests.spark.conftest import start_spark


def train() -> dict:
    # As Horovod's Spark GPU examples do: the worker picks the GPU its task was given.
    from horovod.spark.task import get_available_devices

    import horovod.numpy as hvd

    hvd.init()
    return {"rank": hvd.rank(), "devices": get_available_devices()}


def main(discovery_script: str) -> None:
    import cloudpickle

    import horovod.spark

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = start_spark(app="khorovod-gpu-resources", conf={
        "spark.worker.resource.gpu.amount": "2",
        "spark.worker.resource.gpu.discoveryScript": discovery_script,
        "spark.executor.resource.gpu.amount": "2",
        "spark.executor.resource.gpu.discoveryScript": discovery_script,
        "spark.task.resource.gpu.amount": "1",
    })
    try:
        print("RESULTS " + json.dumps(horovod.spark.run(train, num_proc=2)), flush=True)
    finally:
        spark.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(sys.argv[1])
