"""A real Ray cluster on this machine for the Ray tests: a head and a second node (separate raylets,
so placement spans "nodes"), started once for the folder and stopped at the end.

Ray's own test utility (`ray.cluster_utils.Cluster`) starts the nodes as this process's children,
adds and removes nodes on demand (the elastic test) and stops every process it started. Each
node gets 2 logical CPUs. The memory monitor is off: the machine is shared, and Ray would kill
workers when the others' tests use memory.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from leftovers import live_processes

REPO = Path(__file__).resolve().parents[2]
CPUS_PER_NODE = 2


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="the Ray tests need the [ray] extra (pip install -e '.[ray]')")
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        env.setenv("RAY_memory_monitor_refresh_ms", "0")
        env.setenv("RAY_AUTH_MODE", "disabled")
        # The actors import horovod and these tests' functions (and their helpers) from this checkout.
        env.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), str(REPO / "tests" / "support"),
                                                                os.environ.get("PYTHONPATH")])))
        cluster = Cluster(initialize_head=True, connect=True,
                          head_node_args={"num_cpus": CPUS_PER_NODE, "include_dashboard": False,
                                          "object_store_memory": 150 * 1024 * 1024})
        try:
            cluster.add_node(num_cpus=CPUS_PER_NODE)
            cluster.wait_for_nodes()
            yield cluster
        finally:
            pids = [info.process.pid for node in cluster.list_all_nodes()
                    for infos in node.all_processes.values() for info in infos if info.process is not None]
            ray.shutdown()
            cluster.shutdown()
    deadline = time.monotonic() + 30
    while live_processes(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_processes(pids) == [], "the Ray cluster left processes running"

