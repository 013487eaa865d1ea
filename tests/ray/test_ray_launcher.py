"""The `ray` launcher (what the elastic driver starts workers with): a worker is an actor on the
node its slot names, with exactly the environment it is given, that runs `horovod.run`'s
function, reports its exit status, and is stopped by `stop_all`."""

from __future__ import annotations

import signal
import time

import cloudpickle
import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")

from horovod.common import wire  # noqa: E402
from horovod.common.rendezvous import RendezvousServer  # noqa: E402
from horovod.runner import launchers  # noqa: E402
from horovod.runner.hosts import SlotInfo  # noqa: E402
from horovod.runner.job import worker_env  # noqa: E402
from horovod.runner.launchers import LaunchContext  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def sleepy() -> str:
    import os

    if os.environ.get("NAP"):
        time.sleep(float(os.environ["NAP"]))
    return f"{os.environ['HOROVOD_HOSTNAME']} {os.environ['HOROVOD_RANK']} {os.environ.get('EXTRA')}"


def test_a_worker_actor_on_each_node_runs_the_function_and_is_stopped(ray_cluster):
    secret = wire.new_secret_key()
    store = RendezvousServer(secret, ray.util.get_node_ip_address())
    port = store.start()
    try:
        store.put("runfunc", "func", cloudpickle.dumps((sleepy, (), {})))
        launcher = launchers.create("ray", LaunchContext(command=("horovod.runner.run_task",), secret_hex=secret.hex(),
                                                         cwd=".", resources={"CPU": 1}))
        nodes = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
        slots = [SlotInfo(node, rank, 0, rank, 2, 1, 2) for rank, node in enumerate(nodes[:2])]
        envs = [worker_env({}, {"EXTRA": "x"}, slot, store.address[0], port) for slot in slots]
        envs[1]["NAP"] = "60"
        workers = [launcher.start(slot, env) for slot, env in zip(slots, envs)]
        assert workers[0].wait(timeout=60) == 0
        assert cloudpickle.loads(store.get("runfunc_result", "0")) == f"{nodes[0]} 0 x"
        assert workers[1].wait(timeout=1) is None  # still napping
        launchers.stop_all(workers, grace_seconds=1)
        assert workers[1].returncode == -signal.SIGTERM
        assert "died" in workers[1].stderr_tail()[0]
    finally:
        store.stop()
