"""horovod.tensorflow.data with a real tf.data service: a compute job (horovodrun -np 2 python -m
horovod.tensorflow.data.compute_worker) serves a training job of 2 ranks, with the dispatchers in
either job; the training job ends the compute job. The service's own checks run in-process."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("tensorflow")

from multirank import REPO, child_env, hvdrun  # noqa: E402

TRAINING = r'''
import os
import tensorflow as tf
import horovod.tensorflow as hvd
from horovod.tensorflow.data.compute_service import TfDataServiceConfig, tf_data_service

hvd.init()
r, n = hvd.rank(), hvd.size()
config = TfDataServiceConfig.read(os.environ["CONFIG"], wait_for_file_creation=True, wait_seconds=120)
dataset = tf.data.Dataset.range(20).map(lambda x: x * 10)
if config.dispatcher_side == "compute":
    shared = [int(x) for x in dataset.send_to_data_service(config, r, n, reuse_dataset=True)]
    own = [int(x) for x in dataset.send_to_data_service(config, r, n)]
    report(shared=hvd.allgather_object(shared), own=sorted(own))
else:
    try:
        dataset.send_to_data_service(config, r, n)
    except RuntimeError as exc:
        report(refused=str(exc))
    with tf_data_service(config, r) as address:
        own = [int(x) for x in dataset.apply(tf.data.experimental.service.distribute("distributed_epoch", address))]
    report(own=sorted(own), dispatchers=hvd.allgather_object(address))
hvd.allgather_object(None)  # everyone has read everything before the compute job goes
if r == 0:
    config.compute_client().shutdown()
'''


def run_both_jobs(tmp_path, *compute_args: str):
    config = tmp_path / "compute.json"
    command = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable, "-m",
               "horovod.tensorflow.data.compute_worker", str(config), "--timeout", "60", *compute_args]
    compute = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=child_env(), cwd=REPO)
    try:
        training = hvdrun(TRAINING, np=2, env={"CONFIG": str(config)}, timeout=180)
        output, _ = compute.communicate(timeout=60)
    finally:
        if compute.poll() is None:  # horovodrun stops its workers on SIGTERM
            compute.send_signal(signal.SIGTERM)
            compute.communicate(timeout=30)
    assert training.returncode == 0, f"training job failed ({training.returncode}):\n{training.stdout}\n" \
                                     f"{training.stderr}\n--- the compute job printed:\n{output}"
    return training.check(), compute.returncode, output


def test_compute_side_dispatcher_shares_or_repeats_the_dataset(tmp_path):
    training, returncode, output = run_both_jobs(tmp_path)
    assert returncode == 0, output
    expected = [10 * i for i in range(20)]
    for rank in (0, 1):
        got = training.ranks[rank]
        shared = got["shared"]
        assert sorted(shared[0] + shared[1]) == expected, shared  # one job: every element to one rank
        assert got["own"] == expected  # a job of its own: the whole dataset


def test_training_side_dispatchers_one_per_rank(tmp_path):
    training, returncode, output = run_both_jobs(tmp_path, "--dispatchers", "2", "--dispatcher-side", "training")
    assert returncode == 0, output
    for rank in (0, 1):
        got = training.ranks[rank]
        assert got["own"] == [10 * i for i in range(20)]
        assert len(set(got["dispatchers"])) == 2  # each training rank ran its own dispatcher
        assert "dispatcher_side='compute'" in got["refused"] and "tf_data_service" in got["refused"]


def test_compute_job_refuses_dispatchers_that_do_not_divide_it(tmp_path):
    command = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable, "-m",
               "horovod.tensorflow.data.compute_worker", str(tmp_path / "c.json"), "--dispatchers", "3"]
    proc = subprocess.run(command, capture_output=True, text=True, env=child_env(), cwd=REPO, timeout=120)
    assert proc.returncode != 0
    assert "2 processes cannot be split among 3 dispatchers" in proc.stdout + proc.stderr


def test_service_config_and_client_errors(tmp_path):
    from horovod.common.wire import new_secret_key
    from horovod.runner.compute_service import ComputeService
    from horovod.tensorflow.data.compute_service import TfDataServiceConfig

    key = new_secret_key()
    service = ComputeService(2, 1, key, nics=["lo"])
    try:
        config = TfDataServiceConfig(2, 1, "compute", service.addresses(), key, timeout=1)
        config.write(str(tmp_path / "c.json"))
        again = TfDataServiceConfig.read(str(tmp_path / "c.json"))
        assert again == config and again.addresses == {"lo": [("127.0.0.1", service.addresses()["lo"][0][1])]}
        client = again.compute_client()
        client.register_dispatcher(1, "grpc://127.0.0.1:1")
        assert client.wait_for_dispatcher_registration(1, 1) == "grpc://127.0.0.1:1"
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="dispatcher 0 did not register within 1 s"):
            client.wait_for_dispatcher_registration(0, 1)
        with pytest.raises(TimeoutError, match="compute worker 1 of dispatcher 1 did not register"):
            client.wait_for_dispatcher_worker_registration(1, 1)
        assert time.monotonic() - start < 5
        with pytest.raises(ValueError, match="dispatcher 2 does not exist: the compute job has 2"):
            client.register_dispatcher(2, "grpc://x")
        client.shutdown()
        client.wait_for_shutdown()  # returns at once: the training side asked the compute job to stop
        client.close()
    finally:
        service.shutdown()
    with pytest.raises(ValueError, match="dispatcher_side must be 'compute' or 'training'"):
        TfDataServiceConfig(1, 1, "elsewhere", {}, key)
    with pytest.raises(TimeoutError, match="did not write .* within 0.2 s"):
        TfDataServiceConfig.read(str(tmp_path / "missing.json"), wait_for_file_creation=True, wait_seconds=0.2)
    with pytest.raises(ConnectionError, match="cannot reach the compute service"):
        TfDataServiceConfig(1, 1, "compute", {"lo": [("127.0.0.1", 1)]}, key).compute_client()
