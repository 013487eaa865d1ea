"""Jobs started by torch-style launchers (torchrun, a PyTorchJob's environment) meet as one job.

Real processes throughout: torchrun itself, or plain `python` processes given the variables a
Kubernetes operator sets. The variable parsing and the launcher detection are pure functions.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from horovod.common.bootstrap.torchrun import TorchrunBootstrap
from horovod.common.launcher_env import check_not_alone, launcher_sizes, torch_launch
from horovod.common.settings import Settings, detect_bootstrap
from tests.support.multirank import child_env, hvdrun

pytestmark = pytest.mark.timeout(60)

TORCH = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
WARNING = "no job secret was given"
# The same training step under every launcher; `report` is defined by whoever runs it.
STEP = """\
import torch
import horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.arange(4, dtype=torch.float32) * (hvd.rank() + 1), op=hvd.Sum)
report(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
       total=total.tolist())
hvd.shutdown()
"""
# Ranks under torchrun share one stdout: each report is one write, so lines never interleave.
SCRIPT = """\
import json, os
def report(**values):
    os.write(1, ("RESULT:" + json.dumps(values) + "\\n").encode())
""" + STEP


# -- parsing and detection ---------------------------------------------------------------------

def test_torchrun_slot_of_two_hosts_of_two():
    launch = torch_launch({**TORCH, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                           "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert launch is not None
    slot = launch.slot
    assert (slot.rank, slot.size, slot.local_rank, slot.local_size, slot.cross_rank, slot.cross_size) == \
        (3, 4, 1, 2, 1, 2)
    assert (launch.master_addr, launch.master_port, launch.restart_count, launch.agent_store) == \
        ("node0", 29500, 2, True)


def test_pytorchjob_pod_without_local_variables_is_alone_on_its_host():
    launch = torch_launch(TORCH)
    assert launch is not None and not launch.agent_store and launch.restart_count == 0
    slot = launch.slot
    assert (slot.local_rank, slot.local_size, slot.cross_rank, slot.cross_size) == (0, 1, 3, 4)
    assert torch_launch({**TORCH, "NODE_RANK": "2", "RANK": "2"}).slot.cross_rank == 2
    assert torch_launch({**TORCH, "JOB_COMPLETION_INDEX": "1", "RANK": "1"}).slot.cross_rank == 1


def test_torch_launch_needs_all_four_variables():
    for missing in TORCH:
        assert torch_launch({k: v for k, v in TORCH.items() if k != missing}) is None


@pytest.mark.parametrize("bad, named", [
    ({"RANK": "four"}, "RANK='four'"),
    ({"RANK": "4"}, "RANK=4"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2"),
    ({"LOCAL_WORLD_SIZE": "8"}, "LOCAL_WORLD_SIZE=8"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
    ({"GROUP_RANK": "4"}, "GROUP_RANK=4"),
    ({"TORCHELASTIC_RESTART_COUNT": "x"}, "TORCHELASTIC_RESTART_COUNT='x'"),
])
def test_a_bad_value_names_the_variable(bad, named):
    with pytest.raises(ValueError, match=named):
        torch_launch({**TORCH, **bad})


def test_detection_of_a_torch_style_launcher():
    assert detect_bootstrap(TORCH) == "torchrun"
    assert detect_bootstrap({**TORCH, "HOROVOD_RANK": "0"}) == "env"  # horovodrun's own workers
    assert detect_bootstrap({**TORCH, "OMPI_COMM_WORLD_SIZE": "4"}) == "mpi"
    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    assert detect_bootstrap({**TORCH, **slurm}) == "mpi"
    # `srun torchrun ...`: torchrun is the launcher nearest the process.
    assert detect_bootstrap({**TORCH, **slurm, "TORCHELASTIC_RUN_ID": "job"}) == "torchrun"
    assert detect_bootstrap({"RANK": "0", "WORLD_SIZE": "2"}) == "env"
    settings = Settings.from_env({**TORCH, "HOROVOD_SECRET_KEY_FILE": "/etc/hvd/key"})
    assert settings.bootstrap == "torchrun" and settings.torch_launch is not None
    assert settings.secret_key_file == "/etc/hvd/key"
    assert Settings.from_env({**TORCH, "HOROVOD_BOOTSTRAP": "env"}).torch_launch is None
    explicit = Settings.from_env({**TORCH, "OMPI_COMM_WORLD_SIZE": "4", "HOROVOD_BOOTSTRAP": "torchrun"})
    assert explicit.bootstrap == "torchrun" and explicit.torch_launch is not None
    with pytest.raises(ValueError, match="_HOROVOD_SECRET_KEY is not hexadecimal"):
        Settings.from_env({"_HOROVOD_SECRET_KEY": "not hex"})
    with pytest.raises(ValueError, match="needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT"):
        TorchrunBootstrap().join(Settings.from_env({"HOROVOD_BOOTSTRAP": "torchrun"}), 0)


def test_launcher_sizes_and_the_alone_check():
    assert launcher_sizes({"WORLD_SIZE": "1", "PMI_SIZE": "3"}) == (("PMI_SIZE", 3),)
    assert launcher_sizes({"SLURM_NTASKS": "4"}) == ()  # a batch script, not a job step
    assert launcher_sizes({"SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}) == (("SLURM_NTASKS", 4),)
    assert Settings.from_env({"WORLD_SIZE": "2", "HOROVOD_SIZE": "1"}).launcher_sizes == ()
    check_not_alone("env", 2, (("WORLD_SIZE", 2),))
    check_not_alone("env", 1, ())
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_SIZE=8"):
        check_not_alone("mpi", 1, (("OMPI_COMM_WORLD_SIZE", 8),))


# -- real jobs ---------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _results(stdout: str) -> dict[int, dict]:
    found = [json.loads(line[len("RESULT:"):]) for line in stdout.splitlines() if line.startswith("RESULT:")]
    return {result["rank"]: result for result in found}


def _torchrun(tmp_path: Path, *launcher_args: str) -> tuple[dict[int, dict], str]:
    pytest.importorskip("torch")
    torchrun = Path(sys.executable).parent / "torchrun"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", *launcher_args, str(script)],
                          env=child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return _results(proc.stdout), proc.stderr


def _expected_from_horovodrun() -> dict[int, dict]:
    return hvdrun(STEP, np=2, timeout=50).check().ranks


def _assert_one_job_like_horovodrun(results: dict[int, dict]) -> None:
    expected = _expected_from_horovodrun()
    assert sorted(results) == [0, 1]
    for rank in (0, 1):
        assert results[rank]["size"] == 2 and results[rank]["local_size"] == 2
        assert results[rank]["local_rank"] == rank
        assert results[rank]["total"] == expected[rank]["total"] == [0.0, 3.0, 6.0, 9.0]


def test_torchrun_two_processes_are_one_job(tmp_path):
    results, stderr = _torchrun(tmp_path, "--master_port", str(_free_port()))
    _assert_one_job_like_horovodrun(results)
    assert stderr.count(WARNING) == 2  # once per rank


def test_torchrun_with_the_c10d_rendezvous(tmp_path):
    results, _ = _torchrun(tmp_path, "--nnodes", "1", "--rdzv-backend", "c10d",
                           "--rdzv-endpoint", f"127.0.0.1:{_free_port()}")
    _assert_one_job_like_horovodrun(results)


def _pytorchjob(tmp_path: Path, code: str, extra: list[dict[str, str]]) -> list[subprocess.CompletedProcess]:
    """Run `code` as the processes of a PyTorchJob: no launcher, only the operator's variables."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code))
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              env=child_env({"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                             "MASTER_PORT": port, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                             "HOROVOD_START_TIMEOUT": "10", **extra[rank]}))
             for rank in range(len(extra))]
    done = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=40)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def test_pytorchjob_environment_without_a_secret_warns_once_per_rank(tmp_path):
    done = _pytorchjob(tmp_path, SCRIPT, [{}, {}])
    for rank, proc in enumerate(done):
        assert proc.returncode == 0, proc.stderr
        result = _results(proc.stdout)[rank]
        assert (result["size"], result["local_rank"], result["local_size"]) == (2, 0, 1)
        assert result["total"] == [0.0, 3.0, 6.0, 9.0]
        assert proc.stderr.count(WARNING) == 1, proc.stderr


def test_a_secret_file_is_the_job_secret(tmp_path):
    (tmp_path / "secret").write_bytes(b"one secret for the whole job\n")
    (tmp_path / "other").write_bytes(b"a stranger's secret")
    done = _pytorchjob(tmp_path, SCRIPT, [{"HOROVOD_SECRET_KEY_FILE": str(tmp_path / "secret")}] * 2)
    for proc in done:
        assert proc.returncode == 0 and WARNING not in proc.stderr, proc.stderr
    # The file is what authenticates: a rank holding another secret is refused by rank 0's store.
    quick = {"HOROVOD_START_TIMEOUT": "3"}  # rank 0 then gives up waiting for rank 1 soon
    done = _pytorchjob(tmp_path, SCRIPT, [{"HOROVOD_SECRET_KEY_FILE": str(tmp_path / "secret"), **quick},
                                          {"HOROVOD_SECRET_KEY_FILE": str(tmp_path / "other"), **quick}])
    assert done[1].returncode != 0 and "wrong secret key" in done[1].stderr
    assert done[0].returncode != 0 and WARNING not in done[1].stderr


def test_alone_while_the_launcher_says_otherwise_raises(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\n")
    env = child_env({"WORLD_SIZE": "2"})
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=40)
    assert proc.returncode != 0
    assert "ValueError" in proc.stderr and "WORLD_SIZE=2" in proc.stderr, proc.stderr


def test_a_torchrun_restart_forms_the_job_again(tmp_path):
    """The first attempt loses rank 1 after init(); torchrun restarts both, and they meet afresh."""
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""\
        import os, sys, torch
        import horovod.torch as hvd
        hvd.init()
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        if attempt == "0" and hvd.rank() == 1:
            sys.exit(3)
        total = hvd.allreduce(torch.ones(2), op=hvd.Sum)
        with open(f"attempt{attempt}.rank{hvd.rank()}", "w") as f:
            f.write(str(total.tolist()))
        """))
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2",
                           "--max-restarts", "1", "--master_port", str(_free_port()), str(script)],
                          env=child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.glob("attempt*")) == ["attempt1.rank0", "attempt1.rank1"]
    assert (tmp_path / "attempt1.rank1").read_text() == "[2.0, 2.0]"


def test_horovodrun_inside_a_torchrun_environment_runs_its_own_job():
    # A PyTorchJob pod (or a torchrun worker) that runs horovodrun: its workers inherit RANK,
    # WORLD_SIZE, MASTER_*, TORCHELASTIC_RUN_ID, even the pod's HOROVOD_BOOTSTRAP=torchrun, and must
    # still join horovodrun's job: horovodrun names its own bootstrap.
    pod = {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "10.9.9.9",
           "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "outer", "HOROVOD_BOOTSTRAP": "torchrun"}
    result = hvdrun("import horovod.numpy as hvd, numpy as np\nhvd.init()\n"
                    "report(rank=hvd.rank(), size=hvd.size(), total=hvd.allreduce(np.ones(1), op=hvd.Sum)[0])\n",
                    np=2, env=pod, timeout=60).check()
    assert {r: (v["size"], v["total"]) for r, v in result.ranks.items()} == {0: (2, 2.0), 1: (2, 2.0)}
