"""The ssh launcher against real OpenSSH: sshd on port 2222 in two emulated hosts (namespaces).

Horovod's documented usage for hosts whose sshd is not on port 22 and needs a key:
`horovodrun -np 2 -H host1:1,host2:1 -p 2222 -i ~/.ssh/key python train.py`. The same with
`--mpi` makes Open MPI start its daemons over the same ssh.
"""

from __future__ import annotations

import re
import sys

import pytest

from mpirunner import run_command
from multirank import RunResult, child_env
from netns import EmulatedHosts
from sshd import PORT, RealSsh

TRAIN = ("import socket, numpy as np, horovod.numpy as hvd\nhvd.init()\n"
         "total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum)\n"
         "print('RESULT', hvd.rank(), hvd.size(), total[0], flush=True)\n")


@pytest.fixture
def cluster(tmp_path):
    with EmulatedHosts({"host1": "eth0", "host2": "eth0"}, tmp_path) as hosts:
        ssh = RealSsh(tmp_path)
        try:
            for name in ("host1", "host2"):
                ssh.serve(hosts, name)
            yield hosts, ssh
        finally:
            ssh.close()


def _horovodrun(hosts: EmulatedHosts, ssh: RealSsh, *flags: str, timeout: float = 120) -> RunResult:
    env = child_env()
    env["PATH"] = ssh.env_path(env["PATH"])
    script = hosts.tmp / "train.py"
    script.write_text(TRAIN)
    slots = ",".join(f"{host.address}:1" for host in hosts.hosts)
    return run_command([sys.executable, "-m", "horovod.runner.launch", "-np", "2", "-H", slots, *flags,
                        sys.executable, str(script)], env=env, timeout=timeout, cwd=str(hosts.tmp))


@pytest.mark.timeout(180)
def test_workers_start_over_real_ssh_with_port_and_key(cluster):
    hosts, ssh = cluster
    result = _horovodrun(hosts, ssh, "-p", str(PORT), "-i", str(ssh.identity))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"RESULT (\d) 2 3\.0", result.stdout)) == ["0", "1"], result.stdout

    # Without the port, ssh goes to port 22, where nothing listens: the failure says so.
    refused = _horovodrun(hosts, ssh, "-i", str(ssh.identity), "--start-timeout", "20")
    assert refused.returncode != 0
    assert re.search(r"port 22: Connection refused", refused.stderr), refused.stderr


@pytest.mark.timeout(240)
def test_horovodrun_mpi_hands_port_and_key_to_mpirun(cluster):
    pytest.importorskip("mpi4py")
    hosts, ssh = cluster
    result = _horovodrun(hosts, ssh, "--mpi", "-p", str(PORT), "-i", str(ssh.identity), "--verbose", timeout=180)
    assert "plm_rsh_args" in result.stderr, result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(re.findall(r"RESULT (\d) 2 3\.0", result.stdout)) == ["0", "1"], result.stdout
