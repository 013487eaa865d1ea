"""`horovodrun --mpi`: the mpirun command line per MPI flavour, and real jobs through it."""

import os
import re
import sys
import time

import pytest

from horovod.runner.hosts import HostInfo
from horovod.runner.launchers.mpirun import (INTEL_MPI, MPICH, OPEN_MPI, MpiJob, build_command, exportable, flavor,
                                             launcher_env)
from horovod.runner.launchers.tagged_output import split_tag
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


def test_ssh_port_and_key_reach_every_flavour_in_its_own_spelling():
    job = MpiJob(num_proc=2, hosts=(HostInfo("a", 1), HostInfo("b", 1)), command=("p",), env_names=(),
                 ssh_port=2222, ssh_identity_file="/keys/id ed25519")
    argv = build_command("mpirun", OPEN_MPI, job, as_root=False)
    assert argv[argv.index("plm_rsh_args") + 1] == "-p 2222 -i '/keys/id ed25519'"
    intel = build_command("mpiexec", INTEL_MPI, job, as_root=False)
    assert intel[intel.index("-bootstrap-exec-args") + 1] == "-p 2222 -i '/keys/id ed25519'"
    # Hydra (MPICH) has no flag for ssh's options, only a variable of mpiexec's own.
    assert launcher_env(MPICH, job) == {"HYDRA_LAUNCHER_EXTRA_ARGS": "-p 2222 -i '/keys/id ed25519'"}
    assert launcher_env(OPEN_MPI, job) == {} and launcher_env(MPICH, JOB) == {}
    assert "plm_rsh_args" not in build_command("mpirun", OPEN_MPI, JOB, as_root=False)


def test_open_mpi_starts_the_daemons_of_64_hosts_or_more_from_mpirun():
    many = MpiJob(num_proc=64, hosts=tuple(HostInfo(f"h{i}", 1) for i in range(64)), command=("p",), env_names=())
    argv = build_command("mpirun", OPEN_MPI, many, as_root=False)
    assert argv[argv.index("plm_rsh_no_tree_spawn") + 1] == "true"
    assert argv[argv.index("plm_rsh_num_concurrent") + 1] == "64"
    assert "plm_rsh_no_tree_spawn" not in build_command("mpirun", OPEN_MPI, JOB, as_root=False)


def test_rank_tags_of_open_mpi_and_hydra():
    assert split_tag(b"[1,3]<stdout>: loss 0.5\n", open_mpi=True) == (3, b"loss 0.5\n")
    assert split_tag(b"[prterun-vm-1@1,12]<stderr>: x\n", open_mpi=True) == (None, b"[prterun-vm-1@1,12]<stderr>: x\n")
    assert split_tag(b"[12] loss\n", open_mpi=False) == (12, b"loss\n")
    assert split_tag(b"mpirun noticed that ...\n", open_mpi=True) == (None, b"mpirun noticed that ...\n")


@needs_mpirun
def test_output_flags_and_verbose_are_honoured_under_mpirun(tmp_path):
    # Horovod's documented usage: horovodrun --mpi with the output flags of the Gloo launcher.
    script = tmp_path / "job.py"
    script.write_text("import sys, horovod.numpy as hvd\nhvd.init()\n"
                      "print('out of', hvd.rank(), flush=True)\nprint('err of', hvd.rank(), file=sys.stderr)\n")
    logs = tmp_path / "logs"
    result = run_command([sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", "2",
                          "--output-filename", str(logs), "--prefix-output-with-timestamp", "--verbose",
                          sys.executable, str(script)], timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(2):
        assert (logs / f"rank.{rank}" / "stdout").read_text() == f"out of {rank}\n"
        assert (logs / f"rank.{rank}" / "stderr").read_text() == f"err of {rank}\n"
    stamp = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    assert re.search(rf"^{stamp}\[1,1\]<stdout>: ?out of 1$", result.stdout, re.M), result.stdout
    assert re.search(rf"^{stamp}\[1,0\]<stderr>: ?err of 0$", result.stderr, re.M), result.stderr
    # --verbose shows the mpirun command line, as Horovod does.
    assert re.search(r"^horovodrun: \S*mpirun .*-np 2 ", result.stderr, re.M), result.stderr


@needs_mpirun
def test_horovod_run_with_use_mpi_returns_every_ranks_result():
    # Horovod's documented usage of horovod.run, with mpirun as the controller.
    import horovod

    def train(base):
        import horovod.torch as hvd
        import torch
        hvd.init()
        total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
        return base + hvd.rank(), hvd.size(), hvd.mpi_enabled(), total.item()

    assert horovod.run(train, args=(10,), num_proc=2, use_mpi=True) == [(10, 2, True, 3.0), (11, 2, True, 3.0)]


@needs_mpirun
def test_horovod_run_with_use_mpi_names_the_failing_rank(monkeypatch):
    import horovod

    # Rank 0, done first, waits at shutdown for the failed peer until the peer timeout: keep it short.
    monkeypatch.setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "5")

    def fail():
        import horovod.numpy as hvd
        hvd.init()
        if hvd.rank() == 1:
            raise KeyError("missing shard")
        return hvd.rank()

    with pytest.raises(RuntimeError, match=r"(?s)rank 1 .*KeyError: 'missing shard'"):
        horovod.run(fail, num_proc=2, use_mpi=True)


@needs_mpirun
def test_elastic_flags_with_mpi_run_an_elastic_job_and_say_so(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import os, horovod.numpy as hvd\nhvd.init()\n"
                      "print('ELASTIC', hvd.rank(), hvd.size(), os.environ.get('HOROVOD_ELASTIC'), flush=True)\n")
    result = run_command([sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", "2", "--min-np", "2",
                          "-H", "localhost:2", sys.executable, str(script)], timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--mpi does not apply to an elastic job" in result.stderr
    assert sorted(re.findall(r"ELASTIC (\d) 2 1", result.stdout)) == ["0", "1"], result.stdout
