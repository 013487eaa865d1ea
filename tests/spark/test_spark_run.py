"""horovod.spark.run on a real two-executor Spark cluster (local-cluster mode, see conftest)."""

from __future__ import annotations

import io
import os
import sys
import time
import uuid

import cloudpickle
import pytest

from tests.spark.helpers import none_left

# The functions below travel to the workers by value: the workers cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(240)


def _train(scale: float) -> dict:
    import numpy as np

    import horovod.numpy as hvd

    hvd.init()
    print(f"hello from rank {hvd.rank()}", flush=True)
    total = hvd.allreduce(np.full(3, hvd.rank() + 1.0), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(), "tag": os.environ.get("KHVD_SPARK_TAG"),
            "sum": float(total[0]) * scale}


def _fail_on_rank_one() -> int:
    import horovod.numpy as hvd

    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("rank one fails on purpose")
    return hvd.rank()


def test_results_by_rank_local_ranks_env_and_stdout(spark):
    import horovod.spark

    tag = uuid.uuid4().hex
    out = io.StringIO()
    results = horovod.spark.run(_train, args=(10.0,), num_proc=2, env={"KHVD_SPARK_TAG": tag}, stdout=out)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["size"] == 2 and r["local_size"] == 2 for r in results)  # both executors on 127.0.0.1
    assert sorted(r["local_rank"] for r in results) == [0, 1]
    assert all(r["tag"] == tag for r in results)
    assert all(r["sum"] == 30.0 for r in results)  # (1 + 2) * 10
    text = out.getvalue()
    assert "[0]<stdout>:hello from rank 0" in text and "[1]<stdout>:hello from rank 1" in text
    assert none_left(tag) == []


def test_default_num_proc_is_the_default_parallelism(spark):
    import horovod.spark

    results = horovod.spark.run(_train, args=(1.0,), stdout=io.StringIO())
    assert len(results) == spark.sparkContext.defaultParallelism == 2


def test_a_failing_task_names_rank_host_and_traceback_then_a_second_run_works(spark):
    import horovod.spark

    tag = uuid.uuid4().hex
    with pytest.raises(RuntimeError) as info:
        horovod.spark.run(_fail_on_rank_one, num_proc=2, env={"KHVD_SPARK_TAG": tag},
                          stdout=io.StringIO(), stderr=io.StringIO())
    message = str(info.value)
    assert "rank 1" in message and "127.0.0.1" in message
    assert "ValueError: rank one fails on purpose" in message and "Traceback" in message
    assert "Py4JJavaError" not in message
    assert none_left(tag) == []
    assert horovod.spark.run(_train, args=(1.0,), num_proc=2, stdout=io.StringIO())[1]["rank"] == 1


def test_too_few_slots_is_a_clear_error_not_a_hang(spark):
    import horovod.spark

    started = time.monotonic()
    with pytest.raises((RuntimeError, TimeoutError)) as info:
        horovod.spark.run(_train, args=(1.0,), num_proc=3, start_timeout=30, stdout=io.StringIO())
    assert time.monotonic() - started < 90
    assert "3" in str(info.value) and "slots" in str(info.value)
    assert len(horovod.spark.run(_train, args=(1.0,), num_proc=2, stdout=io.StringIO())) == 2


def test_bad_arguments_fail_before_any_task_starts(spark):
    import horovod.spark

    with pytest.raises(ValueError, match="num_proc"):
        horovod.spark.run(_train, num_proc=0)
    with pytest.raises(ValueError, match="mutually exclusive"):
        horovod.spark.run(_train, num_proc=2, use_mpi=True, use_gloo=True)
    with pytest.raises(ValueError, match="extra_mpi_args"):
        horovod.spark.run(_train, num_proc=2, extra_mpi_args="--mca btl self")


def _ancestors() -> list[str]:
    """The command lines of this process's ancestors, nearest first."""
    names, pid = [], os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            names.append(cmdline.read().replace(b"\0", b" ").decode(errors="replace"))
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rsplit(")", 1)[1].split()[1])
    return names


def _mpi_train() -> dict:
    result = _train(1.0)
    return {**result, "ancestors": _ancestors(), "mpi": os.environ.get("OMPI_COMM_WORLD_SIZE"),
            "control_secret": "_HOROVOD_SPARK_CONTROL_SECRET" in os.environ}


def test_use_mpi_runs_the_ranks_under_mpirun_inside_a_spark_task(spark):
    import horovod.spark

    out, tag = io.StringIO(), uuid.uuid4().hex
    results = horovod.spark.run(_mpi_train, num_proc=2, use_mpi=True, env={"KHVD_SPARK_TAG": tag}, stdout=out)
    assert [(r["rank"], r["size"], r["mpi"], r["sum"]) for r in results] == [(0, 2, "2", 3.0), (1, 2, "2", 3.0)]
    # Both executors run on this machine: one host, so one MPI daemon hosts both ranks.
    assert sorted(r["local_rank"] for r in results) == [0, 1] and {r["local_size"] for r in results} == {2}
    for result in results:  # started by mpirun's daemon, itself started by a Spark task's Python worker
        ancestors = result["ancestors"]
        assert any("prted" in name for name in ancestors), ancestors
        assert any("pyspark" in name for name in ancestors), ancestors
        assert not result["control_secret"]  # mpirun's agent keeps the driver's store secret
    assert "hello from rank 1" in out.getvalue()
    assert not none_left(tag)


def test_use_mpi_a_failing_rank_names_itself(spark):
    import horovod.spark

    with pytest.raises(RuntimeError, match="rank one fails on purpose"):
        horovod.spark.run(_fail_on_rank_one, num_proc=2, use_mpi=True, stdout=io.StringIO(), stderr=io.StringIO())
