"""horovod.spark.run_elastic on a real two-executor Spark cluster (local-cluster mode, see conftest):
an elastic training function, a worker SIGKILLed mid-training, a Spark task killed and run again."""

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


def _train(steps: int, victim: str, marker: str, until_size: int) -> dict:
    """Counts committed steps in an elastic state; each step's allreduce adds the round's size.
    `victim` ("worker" or "task"), once (a marker file says it happened): rank 1 at step 3 SIGKILLs
    its own worker process, or the Spark task's Python process hosting it. Training goes on past
    `steps` until the round has `until_size` workers (for at most 120 s)."""
    import signal

    import torch

    import horovod.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(step=0, total=0.0, sizes=[])
    deadline = time.monotonic() + 120

    @hvd.elastic.run
    def train(state):
        while (state.step < steps or hvd.size() < until_size) and time.monotonic() < deadline:
            total = hvd.allreduce(torch.tensor(1.0), op=hvd.Sum, name="one")
            if state.step == 3 and hvd.rank() == 1 and victim and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid() if victim == "worker" else os.getppid(), signal.SIGKILL)
            state.total += float(total)
            state.sizes.append(hvd.size())
            state.step += 1
            time.sleep(0.02)
            state.commit()

    train(state)
    return {"rank": hvd.rank(), "size": hvd.size(), "step": state.step, "total": state.total,
            "sizes": state.sizes, "env_size": int(os.environ["HOROVOD_SIZE"])}


def test_results_by_rank_of_an_elastic_function(spark, tmp_path):
    import horovod.spark

    err = io.StringIO()
    results = horovod.spark.run_elastic(_train, args=(8, "", "", 1), num_proc=2, stdout=io.StringIO(), stderr=err)
    assert [r["rank"] for r in results] == [0, 1]  # min_num_proc defaults to num_proc: both ranks' results
    for result in results:
        assert result["size"] == result["env_size"] == 2
        assert result["step"] == 8 and result["sizes"] == [2] * 8 and result["total"] == 16.0
    assert "round 1: 2 workers" in err.getvalue()


def test_a_worker_killed_mid_training_leaves_the_survivor_to_finish(spark, tmp_path):
    import horovod.spark

    tag = uuid.uuid4().hex
    err = io.StringIO()
    results = horovod.spark.run_elastic(_train, args=(12, "worker", str(tmp_path / "killed"), 1), num_proc=2,
                                        min_num_proc=1, env={"KHVD_SPARK_TAG": tag}, stdout=io.StringIO(),
                                        stderr=err)
    text = err.getvalue()
    assert (tmp_path / "killed").exists()
    assert "killed by signal SIGKILL" in text and "round 2: 1 workers" in text, text
    [result] = results  # the first min_num_proc (1) ranks of the final round
    assert result["rank"] == 0 and result["size"] == 1 and result["step"] == 12
    # Every committed step counted once, with the size of the round it ran in: the step the
    # victim died in (and any the survivor had not committed) ran again with one worker.
    sizes = result["sizes"]
    assert len(sizes) == 12 and sizes[:3] == [2, 2, 2] and set(sizes[3:]) <= {1, 2} and sizes[-1] == 1
    assert result["total"] == sum(sizes)
    assert none_left(tag) == []


def test_a_killed_spark_task_is_a_host_that_left_and_its_rerun_one_that_came(spark, tmp_path):
    import horovod.spark

    err = io.StringIO()
    results = horovod.spark.run_elastic(_train, args=(12, "task", str(tmp_path / "killed"), 2), num_proc=2,
                                        min_num_proc=1, elastic_timeout=60, stdout=io.StringIO(), stderr=err)
    text = err.getvalue()
    assert (tmp_path / "killed").exists()
    # The silent task left the plan; Spark's second attempt of task 1 came as a new host and
    # joined (whether or not a round of the survivor alone ran in between depends on how soon
    # Spark ran it again).
    assert "hosts changed (removed): now task-0-0:1, task-1-1:1" in text, text
    rounds = [line for line in text.splitlines() if "workers (rank=host:slot:" in line]
    assert rounds[-1].endswith("workers (rank=host:slot: 0=task-0-0:0, 1=task-1-1:0)"), text
    [result] = results
    assert result["rank"] == 0 and result["size"] == 2 and result["step"] >= 12, (result, text)
    assert set(result["sizes"]) <= {1, 2} and result["sizes"][-1] == 2 and result["total"] == sum(result["sizes"])


def test_bad_arguments_are_clear_errors_before_any_task_starts(spark):
    import horovod.spark

    started = time.monotonic()
    for kwargs, words in (({"num_proc": 2, "min_num_proc": 3, "max_num_proc": 2}, "min_num_proc (3) is larger than "
                           "max_num_proc (2)"),
                          ({"num_proc": 2, "min_num_proc": 3}, "min_num_proc (3) is larger than num_proc (2)"),
                          ({"num_proc": 0}, "num_proc must be at least 1"),
                          ({"num_proc": 2, "max_num_proc": 0}, "max_num_proc must be at least 1"),
                          ({"num_proc": 2, "elastic_timeout": 0}, "elastic_timeout must be positive"),
                          ({"num_proc": 2, "reset_limit": -1}, "reset_limit must be at least 0")):
        with pytest.raises(ValueError) as info:
            horovod.spark.run_elastic(_train, args=(1, "", "", 1), **kwargs)
        assert words in str(info.value)
    # Horovod's deprecated spellings min_np / max_np still work, with a DeprecationWarning.
    with pytest.warns(DeprecationWarning, match="min_np= is deprecated, use min_num_proc= instead"), \
            pytest.raises(ValueError, match=r"min_num_proc \(3\) is larger than max_num_proc \(2\)"):
        horovod.spark.run_elastic(_train, args=(1, "", "", 1), num_proc=2, min_np=3, max_np=2)
    with pytest.raises(ValueError, match="give either min_num_proc= or the deprecated min_np=, not both"):
        horovod.spark.run_elastic(_train, args=(1, "", "", 1), num_proc=2, min_np=1, min_num_proc=1)
    assert time.monotonic() - started < 5
