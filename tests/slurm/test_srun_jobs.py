"""Jobs started by `srun` inside a real one-node Slurm cluster (the `slurm` fixture)."""

import re
import sys

import pytest

from examplerun import run_example
from mpirunner import run_command


def test_srun_job_gets_its_slot_from_slurm_and_runs_collectives(slurm, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, numpy as np, horovod.numpy as hvd\n"
        "hvd.init()\n"
        "total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)\n"
        "print('RESULT', os.environ['SLURM_PROCID'], hvd.rank(), hvd.size(), hvd.local_size(), hvd.mpi_enabled(),"
        " total[0], flush=True)\n")
    result = run_command(["srun", "-n", "2", sys.executable, str(script)], env=slurm, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"RESULT (.*)", result.stdout)) == [f"{r} {r} 2 2 True 3.0" for r in range(2)]


def test_srun_without_pmix_says_how_to_fix_it(slurm, tmp_path):
    result = run_command(["srun", "--mpi=none", "-n", "2", sys.executable, "-c",
                          "import horovod.numpy as hvd; hvd.init()"], env=slurm, timeout=120)
    assert result.returncode != 0
    assert "run srun with --mpi=pmix" in result.stderr


@pytest.mark.parametrize("example", ["pytorch", "tensorflow"])
def test_the_examples_run_unchanged_under_srun(slurm, example):
    run_example(["srun", "-n", "2"], example, env=slurm, timeout=300)


def test_horovodrun_inside_an_allocation_uses_its_hosts(slurm):
    import socket

    probe = "import os, horovod.numpy as hvd; hvd.init(); print('RESULT', hvd.rank(), os.environ['HOROVOD_HOSTNAME'])"
    result = run_command(["salloc", "-n", "2", sys.executable, "-m", "horovod.runner.launch", "-np", "2",
                          sys.executable, "-c", probe], env=slurm, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"RESULT (.*)", result.stdout)) == [f"{r} {socket.gethostname()}" for r in range(2)]
