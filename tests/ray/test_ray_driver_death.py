"""A Ray driver that dies (`kill -9`) while its `RayExecutor` trains takes its workers with it.

The driver is a script of its own, connected to the test cluster, so that the test can kill it.
Its actors are the job's: when Ray sees the job's driver go it kills every actor the job owns
(none of ours is detached), and with them the Horovod workers they host, saying why in each
actor's log (`python-core-worker-*_<pid>.log`: "... the actor is dead because its owner has
died"). The workers never talk to the driver again once they train, so this is Ray's doing.
"""

from __future__ import annotations

import os
import signal
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
from horovod.ray import RayExecutor

ray.init(address=sys.argv[2])
executor = RayExecutor(RayExecutor.create_settings(timeout_s=30), num_workers=2)
executor.start(extra_env_vars={"KHVD_RAY_TAG": sys.argv[3]})
executor.run(train_until_stopped, args=[sys.argv[1]])
'''


def tagged(tag: str) -> list[int]:
    """Pids of the processes started with KHVD_RAY_TAG=tag: the actors of one driver."""
    return processes_with_env("KHVD_RAY_TAG", tag)


def test_workers_exit_within_5_s_of_their_ray_driver_being_killed(ray_cluster, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    try:
        with driver(tmp_path, DRIVER, [ray_cluster.address, tag], child_env()) as running:
            workers = running.wait_for_workers(2, seconds=90)
            assert sorted(tagged(tag)) == sorted(workers.values())  # the actors are the workers
            running.kill_and_time(workers, "ray")
        assert tagged(tag) == []
        assert shm_segments(workers.values()) == []
        logs = Path(ray_cluster.head_node.get_logs_dir_path())
        for rank, pid in workers.items():  # Ray's reason, in the log of the actor's process
            text = "".join(path.read_text(errors="replace") for path in logs.glob(f"python-core-worker-*_{pid}.log"))
            assert "owner has died" in text, f"rank {rank}'s log says nothing of its driver:\n{text[-2000:]}"
    finally:
        for pid in tagged(tag):
            os.kill(pid, signal.SIGKILL)
