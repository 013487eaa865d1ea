"""Horovod on a Ray cluster: workers as Ray actors (`RayExecutor`), elastic jobs that follow the
cluster's nodes (`ElasticRayExecutor`), and Horovod training as a Ray Tune trainable
(`horovod.ray.tune.DistributedTrainableCreator`). Needs the `[ray]` extra; see docs/ray.md."""

from horovod.ray.elastic import ElasticRayExecutor
from horovod.ray.runner import RayExecutor, RaySettings
from horovod.ray.worker import BaseHorovodWorker, WorkerError, report

__all__ = ["BaseHorovodWorker", "ElasticRayExecutor", "RayExecutor", "RaySettings", "WorkerError", "report"]
