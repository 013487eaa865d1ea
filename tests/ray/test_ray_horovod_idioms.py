"""What Horovod's Ray examples write, on a real two-node Ray cluster: `ray_logger.log` from the
workers to the driver's callbacks, `ElasticRayExecutor.create_settings(min_np=, max_np=)` with
`settings.discovery = TestDiscovery(...)` and `override_discovery=False` (hosts hidden and shown
again while the job runs), settings assigned after they are made, and
`BaseHorovodWorker(world_rank, world_size)` as an actor of one's own."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")

import horovod.numpy as hvd  # noqa: E402
from horovod.common import elastic  # noqa: E402
from horovod.ray import ElasticRayExecutor, RayExecutor, ray_logger  # noqa: E402
from horovod.ray.elastic import TestDiscovery  # noqa: E402
from horovod.ray.worker import BaseHorovodWorker, WorkerError  # noqa: E402

pytestmark = pytest.mark.timeout(240)
CPUS = 2  # per node (conftest): one slot per node below


def log_from_every_rank() -> int:
    hvd.init()
    ray_logger.log({"chief": hvd.rank()})  # rank 0's only
    ray_logger.log({"every": hvd.rank()}, chief_only=False)
    return hvd.rank()


def test_ray_logger_reaches_the_callbacks(ray_cluster):
    settings = RayExecutor.create_settings(timeout_s=30)
    settings.timeout_s = 60  # a script may change its settings after making them
    executor = RayExecutor(settings, num_workers=2)
    executor.start()
    try:
        got: list[dict] = []
        assert executor.run(log_from_every_rank, callbacks=[got.append]) == [0, 1]
    finally:
        executor.shutdown()
    assert {"chief": 0} in got and not [g for g in got if g.get("chief", 0) != 0]
    assert sorted(g["every"] for g in got if "every" in g) == [0, 1]


def test_ray_logger_outside_a_run_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ray_logger.log({"loss": 1.0})
        ray_logger.log({"loss": 0.5})
    assert [str(w.message) for w in caught] == ["`ray_logger.log` called but logging is not configured."]


def shrank_and_grew(sizes: list[int]) -> bool:
    """The job ran on 2 workers, then 1, then 2 again for a few epochs."""
    text = "".join(map(str, sizes))
    return "21" in text and "2" * 3 in text[text.index("21"):]


def train() -> list[int]:
    hvd.init()
    state = elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0, sizes=[])

    @elastic.run
    def loop(state: elastic.ObjectState) -> list[int]:
        while state.epoch < 400 and not shrank_and_grew(state.sizes):
            state.sizes.append(int(hvd.allreduce(np.ones(1), op=hvd.Sum)[0]))
            state.epoch += 1
            ray_logger.log({"epoch": state.epoch, "size": hvd.size()})
            time.sleep(0.2)
            state.commit()
        return state.sizes

    return loop(state)


def test_test_discovery_hides_and_shows_hosts(ray_cluster):
    # Horovod's basic_ray_elastic.py, on this cluster's two nodes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        settings = ElasticRayExecutor.create_settings(min_np=1, max_np=2, verbose=True)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
        "min_np is deprecated, use min_num_proc instead", "max_np is deprecated, use max_num_proc instead"]
    settings.elastic_timeout, settings.timeout_s = 60, 60
    settings.discovery = TestDiscovery(min_hosts=1, max_hosts=2, change_frequency_s=4, cpus_per_slot=CPUS,
                                       verbose=False)
    assert (settings.min_num_proc, settings.max_num_proc) == (1, 2)
    executor = ElasticRayExecutor(settings, cpus_per_slot=CPUS, override_discovery=False)
    assert settings.discovery.__class__ is TestDiscovery  # kept: not replaced by the cluster's own
    executor.start()
    seen: list[dict] = []
    results = executor.run(train, callbacks=[seen.append])
    assert len(results) == 1  # min_num_proc ranks of the final round
    assert shrank_and_grew(results[0]), results[0]
    assert seen[-1] == {"epoch": len(results[0]), "size": 2}


class Job:
    def __init__(self, greeting: str) -> None:
        self.greeting = greeting


def test_base_horovod_worker_takes_world_rank_and_size(ray_cluster):
    actor = ray.remote(BaseHorovodWorker).options(num_cpus=1).remote(world_rank=1, world_size=2)
    try:
        ray.get(actor.start_executable.remote(Job, ["hello"], {}))
        assert ray.get(actor.execute.remote(lambda job: job.greeting)) == "hello"
        with pytest.raises(WorkerError, match="rank 1 on node"):
            ray.get(actor.execute.remote(lambda job: 1 / 0))
    finally:
        ray.kill(actor)
