"""The module paths Horovod's scripts and tests import from, on 2 real ranks: what Horovod's
test_tensorflow_process_sets.py does before anything else (rank and size from the launcher's
variables, static process sets, `mpi_ops._basics`), the build queries of `horovod.common.util`,
and `horovod.tensorflow.mpi_ops`'s re-exported core API."""

import pytest

pytest.importorskip("tensorflow")

from tfrun import ok, results, run_tf  # noqa: E402

SNIPPET = r'''
from horovod.runner.common.util.env import get_env_rank_and_size
from horovod.common.util import ccl_built, ddl_built, gloo_built, mpi_built, nccl_built
import horovod.tensorflow as hvd
from horovod.tensorflow import mpi_ops

# Horovod's TensorFlowProcessSetsTests.setUpClass
_, size = get_env_rank_and_size()
even_ranks = [rk for rk in range(0, size) if rk % 2 == 0]
odd_ranks = [rk for rk in range(0, size) if rk % 2 == 1]
even_set, odd_set = hvd.ProcessSet(even_ranks), hvd.ProcessSet(odd_ranks)
hvd.init(process_sets=[even_set, odd_set])

@check("env")
def _():
    return [list(get_env_rank_and_size()), hvd.rank(), hvd.size()]

@check("process_sets")
def _():
    ids = mpi_ops._basics._get_process_set_ids_and_ranks()
    return {str(k): v for k, v in ids.items()}

@check("built")
def _():
    return [gloo_built(), mpi_built(verbose=True) == hvd.mpi_built(), nccl_built() == hvd.nccl_built(), ccl_built(),
            ddl_built(), hvd.gpu_available("tensorflow")]

@check("mpi_ops")
def _():
    same = [getattr(mpi_ops, name) is getattr(hvd, name) for name in (
        "init", "shutdown", "size", "rank", "local_size", "local_rank", "cross_size", "cross_rank", "is_initialized",
        "start_timeline", "stop_timeline", "gloo_built", "gloo_enabled", "mpi_built", "mpi_enabled", "nccl_built",
        "ccl_built", "ddl_built", "cuda_built", "rocm_built", "add_process_set", "remove_process_set",
        "Min", "Max", "Product", "Adasum")]
    summed = mpi_ops.allreduce(tf.constant([float(mpi_ops.rank() + 1)]), op=mpi_ops.Max, process_set=even_set
                               if mpi_ops.rank() in even_ranks else odd_set)
    return [all(same), mpi_ops.is_initialized(), mpi_ops.size(), mpi_ops.local_size(), mpi_ops.cross_size(),
            summed.numpy().tolist()]
'''


@pytest.fixture(scope="module")
def run():
    return run_tf(SNIPPET, np=2, timeout=180)


def both(run, key):
    return [ok(results(run, rank)[key]) for rank in (0, 1)]


def test_job_succeeded(run):
    run.check()


def test_env_rank_and_size_before_init(run):
    assert both(run, "env") == [[[0, 2], 0, 2], [[1, 2], 1, 2]]


def test_static_process_sets_through_mpi_ops_basics(run):
    for got in both(run, "process_sets"):
        assert got == {"0": [0, 1], "1": [0], "2": [1]}


def test_common_util_build_queries(run):
    for got in both(run, "built"):
        assert got == [True, True, True, False, False, False]  # gloo (our TCP transport); no GPU here


def test_tensorflow_mpi_ops_reexports_the_core_api(run):
    zero, one = both(run, "mpi_ops")
    assert zero[:5] == one[:5] == [True, True, 2, 2, 1]
    assert zero[5] == [1.0] and one[5] == [2.0]  # each rank alone in its set
