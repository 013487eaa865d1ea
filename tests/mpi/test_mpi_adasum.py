"""op=Adasum on the MPI transport: the shared algorithm over MPI's point-to-point messages gives
the formula's result (every dtype, fused and unfused, identical bits on every rank), and a test
written as Horovod's Adasum tests are (they run only where `hvd.mpi_enabled()`) passes under
`horovodrun --mpi`."""

import pytest

from adasum_reference import AGREES
from mpirunner import MPIRUN, horovodrun_mpi, mpirun

pytestmark = pytest.mark.skipif(not MPIRUN.exists(), reason="no mpirun next to python")


@pytest.mark.parametrize("np_", [2, 4])
def test_adasum_on_the_mpi_transport_agrees_with_the_formula(np_):
    result = mpirun(AGREES, np=np_, timeout=180).check()
    for rank, values in result.every_rank(np_):
        assert values["transport"] == "mpi", rank
        assert values["problems"] == [], f"rank {rank}: {values['problems']}"
    assert len({tuple(v["digests"]) for _, v in result.every_rank(np_)}) == 1  # identical bits everywhere


# In the style of Horovod's test/parallel/test_adasum_pytorch.py: a unittest case that runs only
# where MPI is enabled, on orthogonal vectors (Adasum sums them) and parallel ones (it averages
# them), through allreduce_async + synchronize and allreduce_.
HOROVOD_STYLE = r'''
import unittest

import numpy as np
import torch
import horovod.torch as hvd
from horovod.torch.mpi_ops import synchronize


class AdasumOnMpiTests(unittest.TestCase):
    data_types = [np.float32, np.float16]

    def are_close(self, data_type, expected, got):
        relative = np.linalg.norm(expected - got) / np.linalg.norm(expected)
        return relative < 100 * np.finfo(data_type).eps

    def setUp(self):
        hvd.init()
        if not hvd.mpi_enabled():
            self.skipTest("MPI not enabled")

    def test_orthogonal_vectors_add_up(self):
        size, rank = hvd.size(), hvd.rank()
        rng = np.random.default_rng(2)
        for data_type in self.data_types:
            lengths = [size * 20 - 17, size * 2 + 1, size + 2, 4096]
            columns, expected = [], []
            for n in lengths:
                q, _ = np.linalg.qr(rng.normal(0, 1, (n, size)))
                q = q.astype(data_type)
                expected.append(q.astype(np.float64).sum(axis=1))
                columns.append(torch.from_numpy(q[:, rank].copy()))
            handles = [hvd.allreduce_async(t, op=hvd.Adasum) for t in columns]
            reduced = [synchronize(h) for h in handles]
            for e, got in zip(expected, reduced):
                self.assertTrue(self.are_close(data_type, e, got.numpy().astype(np.float64)), (data_type, len(e)))

    def test_parallel_vectors_average(self):
        size, rank = hvd.size(), hvd.rank()
        rng = np.random.default_rng(3)
        for data_type in self.data_types:
            direction = rng.normal(0, 1, (1024, 1))
            scales = rng.uniform(0.5, 4.0, (size, 1))
            q = (direction @ scales.T).astype(data_type).astype(np.float64)
            tensor = torch.from_numpy(q[:, rank].astype(data_type))
            hvd.allreduce_(tensor, op=hvd.Adasum)
            self.assertTrue(self.are_close(data_type, q.sum(axis=1) / size, tensor.numpy().astype(np.float64)))


result = unittest.main(exit=False, argv=["adasum"]).result
report(run=result.testsRun, skipped=len(result.skipped), failures=[str(f[1]) for f in result.failures + result.errors],
       mpi_enabled=hvd.mpi_enabled())
'''


def test_horovod_style_adasum_tests_pass_under_horovodrun_mpi():
    pytest.importorskip("torch")
    result = horovodrun_mpi(HOROVOD_STYLE, np=2, timeout=180).check()
    for rank, got in result.every_rank(2):
        assert got["mpi_enabled"] is True, rank
        assert got["run"] == 2 and got["skipped"] == 0 and got["failures"] == [], (rank, got)
