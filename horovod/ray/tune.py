"""Horovod training as a Ray Tune trainable: each trial is a small Horovod job on the cluster.

`DistributedTrainableCreator(func, ...)` (the name and arguments Horovod users know from Ray's
former integration) returns a function trainable that Tune schedules with a placement group of
one empty head bundle (the trial's driver, which only waits) and one bundle per worker. The
trial starts a `RayExecutor` in that placement group, runs `func(config)` on every worker and
forwards each value rank 0 passes to `horovod.ray.report` to `ray.tune.report`.
"""

from __future__ import annotations

from typing import Any, Callable

from ray import tune

from horovod.ray.placement import Layout
from horovod.ray.runner import RayExecutor
from horovod.ray.settings import NO_SSH, warn_ignored


def DistributedTrainableCreator(func: Callable[[dict[str, Any]], Any], use_gpu: bool = False,
                                num_hosts: int | None = None, num_workers: int = 1,
                                num_cpus_per_worker: float = 1, timeout_s: float = 30,
                                replicate_pem: bool = False) -> Any:
    """A Tune trainable running `func(config)` on `num_workers` Horovod workers per trial (with
    `num_hosts`: `num_workers` per host). Rank 0 reports metrics with `horovod.ray.report(dict)`."""
    if replicate_pem:
        warn_ignored("replicate_pem=True", NO_SSH)
    hosts_kwargs: dict[str, Any] = {"num_hosts": num_hosts, "num_workers_per_host": num_workers} \
        if num_hosts is not None else {"num_workers": num_workers}
    layout = Layout.of(num_workers if num_hosts is None else None, num_hosts, num_workers,
                       num_cpus_per_worker, use_gpu, None)

    def trainable(config: dict[str, Any]) -> None:
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=timeout_s), cpus_per_worker=num_cpus_per_worker,
                               use_gpu=use_gpu, use_current_placement_group=True, **hosts_kwargs)
        executor.start()
        try:
            executor.run(func, args=[config], callbacks=[tune.report])
        finally:
            executor.shutdown()

    trainable.__name__ = getattr(func, "__name__", "horovod_trainable")
    resources = tune.PlacementGroupFactory([{}, *layout.bundles()], strategy=layout.strategy())
    return tune.with_resources(trainable, resources)


__all__ = ["DistributedTrainableCreator"]
