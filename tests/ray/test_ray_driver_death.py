"""A Ray driver that dies (`kill -9`) while its `RayExecutor` (or `ElasticRayExecutor`) trains
takes its workers with it.

The driver is a script of its own, connected to the test cluster, so that the test can kill it.
Its actors are the job's: when Ray sees the job's driver go it kills every actor the job owns
(none of ours is detached), and with them the Horovod workers they host. Its raylet's log says
so (`Driver (pid=...) is disconnected`, then the workers it stops); the log of each actor's
process usually says why too (`The actor is dead because its owner has died`), unless the
raylet's SIGTERM ends it first. The workers never talk to the driver again once they train, so
this is Ray's doing.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")

from driver_death import driver  # noqa: E402
from leftovers import processes_with_env, shm_segments  # noqa: E402
from multirank import child_env  # noqa: E402

pytestmark = pytest.mark.timeout(180)

DRIVER = r'''
import sys
import ray
from driver_death import train_until_stopped
from horovod.ray import ElasticRayExecutor, RayExecutor

pid_dir, address, tag, kind = sys.argv[1:]
ray.init(address=address)
if kind == "elastic":
    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, timeout_s=30)
    executor = ElasticRayExecutor(settings, cpus_per_slot=1, env_vars={"KHVD_RAY_TAG": tag})
    executor.start()
    executor.run(lambda: train_until_stopped(pid_dir))
else:
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
    executor.start(extra_env_vars={"KHVD_RAY_TAG": tag})
    executor.run(train_until_stopped, args=[pid_dir])
'''


def tagged(tag: str) -> list[int]:
    """Pids of the processes started with KHVD_RAY_TAG=tag: the actors of one driver."""
    return processes_with_env("KHVD_RAY_TAG", tag)


@pytest.mark.parametrize("kind", ["executor", "elastic"])
def test_workers_exit_within_5_s_of_their_ray_driver_being_killed(ray_cluster, tmp_path: Path, kind: str) -> None:
    tag = uuid.uuid4().hex
    try:
        with driver(tmp_path, DRIVER, [ray_cluster.address, tag, kind], child_env()) as running:
            workers = running.wait_for_workers(2, seconds=90)
            assert sorted(tagged(tag)) == sorted(workers.values())  # the actors are the workers
            running.kill_and_time(workers, f"ray ({kind})")
        assert tagged(tag) == []
        assert shm_segments(workers.values()) == []
        # Ray says why, in the log of the raylet the driver was connected to.
        said = f"Driver (pid={running.proc.pid}) is disconnected"
        logs = Path(ray_cluster.head_node.get_logs_dir_path())
        deadline = time.monotonic() + 10
        while not any(said in path.read_text(errors="replace") for path in logs.glob("raylet*.out")):
            assert time.monotonic() < deadline, f"no raylet log says {said!r}"
            time.sleep(0.2)
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
