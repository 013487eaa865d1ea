"""A real one-node Slurm cluster for the tests: munged, slurmctld and slurmd in the foreground.

Started once per module as root (Debian's slurm-wlm and munge; CI installs them through
scripts/setup-venv.sh) and stopped afterwards: no daemon, no state directory is left behind.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from engines import engine_unavailable

_NEEDED = ("slurmctld", "slurmd", "srun", "munged")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(tmp: Path, host: str) -> str:
    return "\n".join([
        "ClusterName=khorovod", f"SlurmctldHost={host}", "SlurmUser=root", "AuthType=auth/munge",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "MpiDefault=pmix", "ReturnToService=2", "SchedulerType=sched/builtin",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        f"StateSaveLocation={tmp}/state", f"SlurmdSpoolDir={tmp}/spool",
        f"SlurmctldPidFile={tmp}/slurmctld.pid", f"SlurmdPidFile={tmp}/slurmd.pid",
        f"SlurmctldLogFile={tmp}/slurmctld.log", f"SlurmdLogFile={tmp}/slurmd.log",
        f"NodeName={host} CPUs={os.cpu_count()} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        "",
    ])


@pytest.fixture(scope="module")
def slurm() -> dict[str, str]:
    """The environment that points srun at a running one-node cluster."""
    missing = [tool for tool in _NEEDED if shutil.which(tool) is None]
    if missing:
        engine_unavailable(f"Slurm is not installed ({', '.join(missing)} missing; apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        engine_unavailable("the Slurm fixture starts slurmctld/slurmd as root")
    tmp = Path(tempfile.mkdtemp(prefix="khorovod-slurm-"))
    for sub in ("state", "spool", "munge"):
        (tmp / sub).mkdir()
    host = socket.gethostname()
    conf = tmp / "slurm.conf"
    conf.write_text(_conf(tmp, host))
    # srun's PMIx plugin keeps each step's files in its own directory, not in /tmp, where a step
    # numbered like one of an earlier cluster's would find its directory taken and fail to launch.
    (tmp / "pmix").mkdir()
    (tmp / "mpi.conf").write_text(f"PMIxCliTmpDirBase={tmp}/pmix\n")
    key = tmp / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = tmp / "munge" / "munge.socket"
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen(["munged", "--foreground", "--force", f"--key-file={key}",
                                 f"--socket={socket_path}", f"--pid-file={tmp}/munged.pid",
                                 f"--log-file={tmp}/munged.log", f"--seed-file={tmp}/munge.seed"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        _wait_for(socket_path.exists, 10, "munged did not start")
        # Slurm finds munge's socket through its AuthInfo setting.
        conf.write_text(_conf(tmp, host) + f"AuthInfo=socket={socket_path}\n")
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(subprocess.Popen([daemon, "-D"], env=env, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
        _wait_for(lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                                                   text=True).stdout, 30, "the Slurm node did not become idle")
        # Open MPI leaves a singleton's shared-memory segment (srun without PMIx) in /dev/shm: keep
        # the tasks' segments in this directory, which goes with the cluster.
        yield {"SLURM_CONF": str(conf), "OMPI_MCA_btl_sm_backing_directory": str(tmp)}
    finally:
        if len(daemons) > 1:  # slurmctld started: a failed test may have left jobs in it
            _cancel_jobs(env)
        for proc in reversed(daemons):
            proc.terminate()
        for proc in reversed(daemons):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _cancel_jobs(env: dict[str, str]) -> None:
    """Cancel what a failed test left running in this cluster (SLURM_CONF names ours alone)."""
    subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True, timeout=30)
    try:
        _wait_for(lambda: not subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True,
                                             timeout=10).stdout.strip(), 20, "jobs did not end")
    except RuntimeError:
        pass  # stopping slurmd below ends their steps anyway


def _wait_for(condition, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        time.sleep(0.2)
