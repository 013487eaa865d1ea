"""`horovod.ray.ray_logger`: Horovod's way for a Ray worker to send a dict of metrics to the
driver's callbacks, as Horovod's Ray examples use it.

    from horovod.ray import ray_logger
    ray_logger.log({"epoch": epoch, "loss": loss})        # rank 0's reaches the callbacks

Inside `RayExecutor.run`/`execute`, `ElasticRayExecutor.run` and Ray Tune trials the channel is
already there (`horovod.ray.report` uses the same one); `configure(queue)` points it at a queue
of one's own.
"""

from __future__ import annotations

import warnings
from typing import Any

from horovod.ray.worker import Reporter, deliver, use_reporter

_warned = False


def configure(queue: Reporter) -> None:
    """Send this worker's `log` calls to `queue` (anything with `put`, e.g. a `ray.util.queue.Queue`)."""
    use_reporter(queue)


def log(info_dict: dict[str, Any], chief_only: bool = True) -> None:
    """Send `info_dict` to the driver: from rank 0 only, unless `chief_only=False`. Warns once
    when there is nowhere to send it."""
    global _warned
    if not deliver(info_dict, chief_only) and not _warned:
        warnings.warn("`ray_logger.log` called but logging is not configured.")
        _warned = True
