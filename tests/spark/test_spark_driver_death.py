"""A Spark driver that dies (`kill -9`) while `horovod.spark.run` trains takes its workers with it.

The driver here is a script of its own, with its own Spark cluster (`local-cluster`: the driver's
JVM and an executor JVM of two task slots, with its Python daemon and two task processes, each
task with its Horovod worker), so that the test can kill it. Every process of that cluster carries a marker in
its environment (`KHVD_SPARK_TAG`, inherited from the driver script): the test finds them all by
it, and kills whatever is left at its end, whatever happened.

The workers never talk to the driver again once they train. In `local-cluster` mode the dying
driver's JVM stops the executors itself (its in-process Spark Worker SIGTERMs them), and each
task's control connection to the driver's store breaks at the same moment; whichever comes first
stops the worker. On a real cluster the executors learn of the driver's death late, and the
control connection is what stops the workers: the second test kills the store under a task
directly, and checks what the task says (on its stderr, the executor's log) and does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import cloudpickle
import pytest

from driver_death import BOUND_SECONDS, driver
from engines import engine_unavailable
from horovod.common.rendezvous import RendezvousClient
from horovod.common.settings import DEFAULT_FAILURE_DETECTION_SECONDS
from horovod.spark import control
from leftovers import seconds_until_gone, shm_segments
from multirank import child_env
from netns import EmulatedHosts, ip
from tests.spark.conftest import spark_missing
from tests.spark.helpers import workers_with

# The rest of the cluster (driver JVM, executor JVMs, their Python daemons) follows by Spark's
# own rules; generous, for a loaded 2-core machine.
CLUSTER_BOUND_SECONDS = 30.0
LOST_DRIVER = "lost its connection to the Spark driver's control store"

pytestmark = pytest.mark.timeout(240)

DRIVER = r'''
import json, os, sys
from driver_death import train_until_stopped
from tests.spark.conftest import start_spark
import horovod.spark

spark = start_spark(executors=1, cores=2)
with open(sys.argv[2] + ".tmp", "w") as f:
    json.dump({"app": spark.sparkContext.applicationId}, f)
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
horovod.spark.run(train_until_stopped, args=(sys.argv[1],), num_proc=2)
'''


def executor_work_dir(app_id: str) -> Path:
    """Where the executors of application `app_id` keep their logs: `local-cluster` mode keeps them
    in the Spark installation's `work` folder, so the test removes them."""
    import pyspark

    return Path(pyspark.__file__).parent / "work" / app_id


@pytest.fixture
def driver_tag() -> Iterator[str]:
    """The marker of one driver's processes; whatever carries it is killed at the end."""
    reason = spark_missing()
    if reason:
        engine_unavailable(reason)
    tag = uuid.uuid4().hex
    try:
        yield tag
    finally:
        for pid in workers_with(tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_workers_exit_within_5_s_of_their_spark_driver_being_killed(tmp_path: Path, driver_tag: str) -> None:
    env = child_env({"KHVD_SPARK_TAG": driver_tag})
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(Path(__file__).resolve().parents[1] / "support")])
    info = tmp_path / "driver.json"
    work: Path | None = None
    try:
        with driver(tmp_path, DRIVER, [str(info)], env) as running:
            workers = running.wait_for_workers(2, seconds=180)
            work = executor_work_dir(json.loads(info.read_text())["app"])
            cluster = [pid for pid in workers_with(driver_tag) if pid != running.proc.pid]
            assert set(workers.values()) <= set(cluster)
            running.kill_and_time(workers, "spark")
        rest = seconds_until_gone(cluster, CLUSTER_BOUND_SECONDS)
        assert None not in rest.values() and workers_with(driver_tag) == [], "the driver's cluster outlived it"
        print(f"spark: the rest of its cluster ({len(cluster)} processes) gone {max(rest.values()):.2f} s "
              "after the driver was killed")
        assert shm_segments(workers.values()) == []
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)


STORE = r'''
import sys, time
from horovod.common import wire
from horovod.common.rendezvous import RendezvousServer

secret = wire.new_secret_key()
print(RendezvousServer(secret, sys.argv[1]).start(), secret.hex(), flush=True)
time.sleep(120)
'''

TASK = r'''
import sys
from horovod.spark.control import ControlAddress
from horovod.spark.task import host_worker, serve_elastic

address = ControlAddress(sys.argv[4], int(sys.argv[1]), sys.argv[2])
if sys.argv[3] == "elastic":
    serve_elastic("task-0-0", "127.0.0.1", (), address, 30)
else:
    sys.exit(host_worker(0, "127.0.0.1", (), address, 30))
'''

# Where each kind of task says it is ready, and the key its worker is sent under.
TASK_KEYS = {"barrier": (control.TASKS, "0", "0"), "elastic": (control.ALIVE, "task-0-0", "task-0-0.0")}

WORKER = r'''
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
'''


@pytest.mark.parametrize("kind, fault", [("barrier", "killed"), ("elastic", "killed"), ("barrier", "cut off")])
def test_a_task_that_loses_its_driver_stops_its_worker_and_says_why(tmp_path: Path, kind: str, fault: str) -> None:
    """The driver's control store dies under a task (`host_worker` as a barrier task of
    `horovod.spark.run` runs it, `serve_elastic` as one of `run_elastic` does) whose worker, with a
    child of its own, trains on; or the driver's host is cut off from the network (its own
    network namespace, its interface taken down), which the task notices when its requests go
    unanswered for the failure detection time (5 s by default)."""
    pids = tmp_path / "pids"
    stack = contextlib.ExitStack()
    store: subprocess.Popen[str] | None = None
    task: subprocess.Popen[str] | None = None
    try:
        if fault == "cut off":
            hosts = stack.enter_context(EmulatedHosts({"driver": "eth0"}, tmp_path))
            where, bound = hosts.host("driver").address, DEFAULT_FAILURE_DETECTION_SECONDS + BOUND_SECONDS
            store_argv = hosts.inside("driver", [sys.executable, "-c", STORE, where])
        else:
            where, bound, store_argv = "127.0.0.1", BOUND_SECONDS, [sys.executable, "-c", STORE, "127.0.0.1"]
        store = subprocess.Popen(store_argv, stdout=subprocess.PIPE, text=True, env=child_env(),
                                 start_new_session=True)
        assert store.stdout is not None
        port, secret = store.stdout.readline().split()
        task = subprocess.Popen([sys.executable, "-c", TASK, port, secret, kind, where], stderr=subprocess.PIPE,
                                text=True, env=child_env(), start_new_session=True)
        driver = RendezvousClient(where, int(port), bytes.fromhex(secret))
        ready_scope, ready_key, key = TASK_KEYS[kind]
        assert driver.get(ready_scope, ready_key, 30).startswith(b"127.0.0.1")
        worker_env = child_env({"HOROVOD_RANK": "3"})
        driver.put(control.START, key, cloudpickle.dumps(([sys.executable, "-c", WORKER, str(pids)], worker_env)))
        deadline = time.monotonic() + 30
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        worker, child = map(int, pids.read_text().split())

        if fault == "cut off":
            ip("-n", hosts.host("driver").namespace, "link", "set", "eth0", "down")
        else:
            store.kill()  # the driver dies, and its store with it
        lost = time.monotonic()
        gone = seconds_until_gone([worker, child], bound)
        assert None not in gone.values(), f"the worker's group outlived its driver by {bound} s"
        print(f"spark task ({kind}): its worker gone {gone[worker]:.2f} s after its driver was {fault}")
        _, stderr = task.communicate(timeout=bound)
        assert time.monotonic() - lost < bound
        assert (f"horovod.spark: task {key} {LOST_DRIVER} at {where}:{port}" in stderr
                and f"stopping the worker so that it does not outlive the driver: rank 3, process group {worker}"
                in stderr), stderr
        if kind == "barrier":  # the task fails, saying the same (an elastic task's job is over: it returns)
            assert task.returncode != 0 and "ConnectionError" in stderr.splitlines()[-1], stderr
    finally:
        groups = [proc.pid for proc in (store, task) if proc is not None]
        if pids.exists():
            groups.append(int(pids.read_text().split()[0]))  # the worker's (it runs in a session of its own)
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in (store, task):
            if proc is not None:
                proc.wait()
        stack.close()
