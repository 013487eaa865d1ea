"""`horovodrun --mpi`: the mpirun command line per MPI flavour, and real jobs through it."""

import os
import re
import sys
import time

import pytest

from horovod.runner.hosts import HostInfo
from horovod.runner.launchers.mpirun import MPICH, OPEN_MPI, MpiJob, build_command, exportable, flavor
from mpirunner import MPIRUN, REPO, run_command

needs_mpirun = pytest.mark.skipif(not MPIRUN.exists(), reason="no mpirun next to python")
JOB = MpiJob(num_proc=4, hosts=(HostInfo("a", 2), HostInfo("b", 2)), command=("python", "train.py"),
             env_names=("HOROVOD_CYCLE_TIME", "PATH"), mpi_args="--report-bindings -x X=1", nics=("eth0",))


def test_the_flavour_comes_from_mpirun_version():
    assert flavor("mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/") == OPEN_MPI
    assert flavor("HYDRA build details:\n    Version:  4.2.0") == MPICH
    assert flavor("Intel(R) MPI Library for Linux* OS, Version 2021.6") == "intelmpi"
    with pytest.raises(ValueError, match="neither Open MPI, MPICH nor Intel MPI"):
        flavor("srun: unrecognized option")


def test_open_mpi_command_line():
    argv = build_command("mpirun", OPEN_MPI, JOB, as_root=True)
    assert argv[:6] == ["mpirun", "--allow-run-as-root", "--tag-output", "-np", "4", "--host"]
    assert argv[6] == "a:2,b:2"
    assert argv[7:11] == ["--bind-to", "none", "--map-by", "slot"]
    assert "btl_tcp_if_include" in argv and argv[argv.index("btl_tcp_if_include") + 1] == "eth0"
    assert argv[-5:] == ["--report-bindings", "-x", "X=1", "python", "train.py"]
    at = argv.index("HOROVOD_CYCLE_TIME")
    assert argv[at - 1] == "-x" and argv[at + 1:at + 3] == ["-x", "PATH"]
    tcp = build_command("mpirun", OPEN_MPI, MpiJob(2, (HostInfo("localhost", 2),), ("p",), (), tcp_only=True,
                                                    binding_args="--bind-to core"), as_root=False)
    assert "--allow-run-as-root" not in tcp and ["--bind-to", "core"] == tcp[6:8]
    assert "tcp,self" in tcp


def test_mpich_command_line():
    argv = build_command("mpiexec", MPICH, JOB, as_root=True)
    assert argv[:6] == ["mpiexec", "-l", "-np", "4", "-hosts", "a:2,b:2"]
    assert argv[6:10] == ["-bind-to", "none", "-map-by", "slot"]
    assert argv[argv.index("-genvlist") + 1] == "HOROVOD_CYCLE_TIME,PATH"
    assert argv[argv.index("-iface") + 1] == "eth0"


def test_the_launchers_own_mpi_and_slurm_variables_are_not_exported():
    names = exportable({"HOROVOD_FUSION_THRESHOLD": "1", "OMPI_COMM_WORLD_RANK": "0", "SLURM_PROCID": "0",
                        "BASH_FUNC_x%%": "()", "PATH": "/bin", "bad name": "x"})
    assert names == ("HOROVOD_FUSION_THRESHOLD", "PATH")


@needs_mpirun
def test_horovodrun_mpi_runs_a_job_with_our_settings_and_mpi_args(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        "import os, numpy as np, horovod.numpy as hvd\n"
        "hvd.init()\n"
        "total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)\n"
        "print('RESULT', hvd.rank(), hvd.size(), hvd.mpi_enabled(), total[0], os.environ['HOROVOD_FUSION_THRESHOLD'],"
        " os.environ['EXTRA'], flush=True)\n")
    result = run_command([sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", "3",
                          "--fusion-threshold-mb", "2", "--mpi-args", "-x EXTRA=from-mpi-args",
                          sys.executable, str(script)], timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(re.findall(r"\[1,(\d)\]<stdout>:\s*RESULT (.*)", result.stdout))
    assert lines == [(str(r), f"{r} 3 True 6.0 2097152 from-mpi-args") for r in range(3)]


@needs_mpirun
def test_horovodrun_mpi_fails_when_a_rank_fails():
    # Rank 0 keeps working while rank 1 fails: mpirun stops it and names rank 1.
    code = ("import sys, numpy as np, horovod.numpy as hvd\nhvd.init()\nif hvd.rank() == 1: sys.exit(5)\n"
            "while True: hvd.allreduce(np.ones(2), name='w')")
    start = time.monotonic()
    result = run_command([sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", "2", sys.executable, "-c",
                          code], timeout=60)
    text = result.stdout + result.stderr
    assert result.returncode in (1, 5) and time.monotonic() - start < 30, text
    # Either mpirun saw rank 1 exit first, or rank 0's collective failed first, naming rank 1.
    assert (re.search(r"Process name: +\[prterun-[^\]]*,1\]\s+Exit code: +5", text)
            or "allreduce.w: rank 1 has shut down" in text), text


def test_more_ranks_than_cores_makes_open_mpi_yield():
    # --host names the slots, so Open MPI would not see the oversubscription and would spin.
    many = MpiJob(num_proc=(os.cpu_count() or 1) + 1, hosts=(HostInfo("localhost", 64),), command=("p",), env_names=())
    argv = build_command("mpirun", OPEN_MPI, many, as_root=False)
    assert "--oversubscribe" in argv and argv[argv.index("mpi_yield_when_idle") + 1] == "1"
    one = MpiJob(num_proc=1, hosts=(HostInfo("localhost", 1),), command=("p",), env_names=())
    assert "mpi_yield_when_idle" not in build_command("mpirun", OPEN_MPI, one, as_root=False)
