"""ElasticRayExecutor on a real Ray cluster whose nodes come and go: a node added while the job
runs gets a worker in the next round, and when that node is removed (its processes killed) the
survivors go on without it; the committed state carries through every round."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")

import horovod.numpy as hvd  # noqa: E402
import horovod.ray  # noqa: E402
from horovod.common import elastic  # noqa: E402
from horovod.ray import ElasticRayExecutor, RayExecutor  # noqa: E402

CPUS = 2  # per node (conftest); one slot per node below


def grew_and_shrank(sizes: list[int]) -> bool:
    """The job ran on 2 workers, then 3, then 2 again for a few epochs."""
    text = "".join(map(str, sizes))
    return "23" in text and "2" * 3 in text[text.index("23"):]


def train() -> list[int]:
    hvd.init()
    state = elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=0, sizes=[])

    @elastic.run
    def loop(state: elastic.ObjectState) -> list[int]:
        while state.epoch < 600 and not grew_and_shrank(state.sizes):
            total = hvd.allreduce(np.ones(1), op=hvd.Sum)  # every rank takes part: the size
            state.sizes.append(int(total[0]))
            state.epoch += 1
            horovod.ray.report((state.epoch, hvd.size()))
            time.sleep(0.2)
            state.commit()
        return state.sizes

    return loop(state)


@pytest.mark.timeout(300)
def test_a_node_joins_then_leaves(ray_cluster):
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=4, elastic_timeout=60,
                                                  timeout_s=60, verbose=True)
    executor = ElasticRayExecutor(settings, cpus_per_slot=CPUS)
    executor.start()
    seen: list[tuple[int, int]] = []  # (epoch, size) as rank 0 reports them
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["results"] = executor.run(train, callbacks=[seen.append])
        except BaseException as exc:  # handed to the test below
            outcome["error"] = exc

    job = threading.Thread(target=run, name="elastic-ray-job")
    job.start()
    # Ray adds and removes nodes from the main thread only: the job runs in another one.
    added = None
    removed = False
    deadline = time.monotonic() + 240
    while job.is_alive() and time.monotonic() < deadline:
        sizes = [size for _, size in seen]
        if added is None and sizes[-1:] == [2]:
            added = ray_cluster.add_node(num_cpus=CPUS)
        elif added is not None and not removed and sizes[-3:] == [3, 3, 3]:
            ray_cluster.remove_node(added)  # kills the node's processes, our worker's actor among them
            removed = True
        time.sleep(0.2)
    if added is not None and not removed:
        ray_cluster.remove_node(added)
    job.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    results = outcome["results"]
    assert len(results) == 2 and results[0] == results[1]  # min_num_proc ranks of the final round
    sizes = results[0]
    assert grew_and_shrank(sizes), sizes
    assert sizes[0] == 2 and max(sizes) == 3
    assert [epoch for epoch, _ in seen][-1] == len(sizes)  # rank 0 reported every committed epoch last


def sizes_and_ranks(scale: int) -> tuple[int, int, int]:
    hvd.init()
    state = elastic.ObjectState(hvd.broadcast_object, hvd.rank, step=0)

    @elastic.run
    def once(state: elastic.ObjectState) -> tuple[int, int, int]:
        return hvd.rank(), hvd.size(), int(hvd.allreduce(np.array([scale]), op=hvd.Sum)[0])

    return once(state)


@pytest.mark.timeout(120)
def test_ray_executor_with_min_and_max_workers_is_elastic(ray_cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2, max_workers=2,
                           cpus_per_worker=CPUS)
    with pytest.raises(ValueError, match="runs functions only"):
        executor.start(executable_cls=dict)
    executor.start()
    assert executor.run(sizes_and_ranks, args=[5]) == [(0, 2, 10), (1, 2, 10)]
    with pytest.raises(NotImplementedError, match="only has run"):
        executor.execute(lambda w: w)
