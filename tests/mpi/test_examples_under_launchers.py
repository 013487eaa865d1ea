"""Horovod-style example scripts (PyTorch and TensorFlow) run unchanged under `horovodrun --gloo`,
`horovodrun --mpi` and a bare `mpirun` (srun: tests/slurm)."""

import sys

import pytest

from examplerun import EXAMPLES, run_example
from mpirunner import MPIRUN, mpirun_flags

pytestmark = pytest.mark.skipif(not MPIRUN.exists(), reason="no mpirun next to python")
LAUNCHERS = {
    "horovodrun --gloo": [sys.executable, "-m", "horovod.runner.launch", "--gloo"],
    "horovodrun --mpi": [sys.executable, "-m", "horovod.runner.launch", "--mpi"],
    "mpirun": [str(MPIRUN), *mpirun_flags()],
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_example_runs_unchanged(launcher, example):
    run_example([*LAUNCHERS[launcher], "-np", "2"], example)
