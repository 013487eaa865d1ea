"""RayExecutor on a real two-node Ray cluster: run/execute/run_remote/execute_single, the slots
the nodes give (local ranks), a failing worker named with its rank, node and traceback, the
executor going on after it, a second executor, bad arguments, and nothing left behind."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")

import horovod.numpy as hvd  # noqa: E402
import horovod.ray  # noqa: E402
from horovod.ray import RayExecutor  # noqa: E402
from leftovers import live_processes  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    """The pids still running after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while live_processes(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return live_processes(pids)


class Counter:
    """An `executable_cls`: state that lives in each worker between calls."""

    def __init__(self, start: int) -> None:
        self.value = start

    def bump(self) -> int:
        self.value += 1
        return self.value


def where_am_i(scale: float) -> dict:
    import os

    hvd.init()
    horovod.ray.report({"rank": hvd.rank(), "size": hvd.size()})
    total = hvd.allreduce(np.full(3, scale * (hvd.rank() + 1)), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(), "cross_size": hvd.cross_size(),
            "node": ray.get_runtime_context().get_node_id(), "sum": total.tolist(), "pid": os.getpid()}


def fail_on_rank_1() -> None:
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank 1 cannot go on")
    hvd.allreduce(np.ones(2), op=hvd.Sum)  # rank 0 waits here for rank 1, which has failed


def test_four_workers_on_two_nodes(ray_cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=4, cpus_per_worker=1)
    executor.start(executable_cls=Counter, executable_args=[10], extra_env_vars={"MY_SETTING": 7})
    reports: list = []
    try:
        out = executor.run(where_am_i, kwargs={"scale": 2.0}, callbacks=[reports.append])
        assert [o["rank"] for o in out] == [0, 1, 2, 3]
        assert {o["size"] for o in out} == {4}
        assert all(o["sum"] == [20.0] * 3 for o in out)  # 2 * (1 + 2 + 3 + 4)
        # Two workers per node (2 CPUs each): ranks 0-1 on one node, 2-3 on the other.
        assert out[0]["node"] == out[1]["node"] != out[2]["node"] == out[3]["node"]
        assert [(o["local_rank"], o["local_size"], o["cross_rank"], o["cross_size"]) for o in out] == \
            [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
        assert executor.node_ids == [o["node"] for o in out]
        assert reports == [{"rank": 0, "size": 4}]  # rank 0's values only
        assert executor.execute(lambda counter: counter.bump()) == [11] * 4
        assert executor.execute_single(lambda counter: counter.bump()) == 12
        assert executor.run(lambda: os.environ.get("MY_SETTING")) == ["7"] * 4
        refs = executor.run_remote(lambda: hvd.rank())
        assert ray.get(refs) == [0, 1, 2, 3]
        pids = [o["pid"] for o in out]
    finally:
        executor.shutdown()
    assert wait_gone(pids) == [], "shutdown() left worker processes running"
    with pytest.raises(RuntimeError, match="not started"):
        executor.run(where_am_i, args=[1.0])


def test_failure_names_rank_node_and_traceback_then_the_next_run_and_executor_work(ray_cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=20), num_hosts=2, num_workers_per_host=1)
    executor.start()
    try:
        assert executor.node_ids[0] != executor.node_ids[1]  # one worker per node
        with pytest.raises(RuntimeError) as failure:
            executor.run(fail_on_rank_1)
        text = str(failure.value)
        assert text.startswith(f"rank 1 on node ") and executor.node_ids[1] in text.splitlines()[0]
        assert "ValueError: rank 1 cannot go on" in text and "in fail_on_rank_1" in text  # the traceback
        assert "rank 0 failed too, after rank 1" in text  # rank 0 was told, instead of waiting
        out = executor.run(where_am_i, args=[1.0])  # the same workers go on
        assert [o["sum"] for o in out] == [[3.0] * 3] * 2
    finally:
        executor.shutdown()
    second = RayExecutor(RayExecutor.create_settings(), num_workers=2)
    second.start()
    try:
        assert [o["rank"] for o in second.run(where_am_i, args=[1.0])] == [0, 1]
    finally:
        second.shutdown()


def test_bad_arguments_and_a_cluster_too_small(ray_cluster):
    settings = RayExecutor.create_settings()
    with pytest.raises(ValueError, match="either num_workers or num_hosts"):
        RayExecutor(settings, num_workers=2, num_hosts=2)
    with pytest.raises(ValueError, match="num_workers=0"):
        RayExecutor(settings, num_workers=0)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(settings, num_workers=1, gpus_per_worker=1)
    too_big = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=3), num_workers=5)
    with pytest.raises(TimeoutError, match="could not place 5 workers with 1 CPU each within 3 s"):
        too_big.start()
    assert too_big.workers == []
    # The failed start freed its reservation: the whole cluster is available again.
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 4


def one_fails_one_hangs() -> None:
    import os

    if int(os.environ["HOROVOD_RANK"]) == 1:
        raise RuntimeError("rank 1 gives up before hvd.init()")
    time.sleep(120)  # outside Horovod: nothing tells rank 0


def test_a_rank_that_never_finishes_after_a_failure_shuts_the_executor_down(ray_cluster):
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=3), num_workers=2)
    executor.start()
    pids = executor.run(os.getpid)
    with pytest.raises(RuntimeError) as failure:
        executor.run(one_fails_one_hangs)
    assert "rank 1 gives up before hvd.init()" in str(failure.value)
    assert "rank 0 had not finished; the executor was shut down" in str(failure.value)
    assert executor.workers == [] and wait_gone(pids) == []
