"""Each Kubernetes example, end to end on an emulation: one network namespace per pod.

There is no Kubernetes control plane here. What each operator would do is done by the test: pods
are namespaces with their own host names and /etc/hosts-style names (`<pod>.<service>`), the
container's command and environment come from the manifest, and the operator's part is added as
it documents it: the MPI Operator's hostfile and ssh keys, with a real sshd on port 2222 in every
worker pod; the training operator's RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; an Indexed
Job's completion index. Mounted Secrets are files of the test. Every flow must give the same
result as horovodrun on this machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from multirank import child_env
from netns import EmulatedHosts
from sshd import RealSsh
from tests.kubernetes.manifests import EXAMPLES, resource

RESULT = re.compile(r"rank (\d)/2 on (\S+): sum of ranks\+1 = 3, weights equal on every rank: True, "
                    r"weight sum (-?[\d.]+)")
SECRET = "5e" * 32


def _local_command(argv: list[str]) -> list[str]:
    """The container's command with this machine's python, horovodrun and example paths."""
    out: list[str] = []
    for word in argv:
        if word == "python":
            out.append(sys.executable)
        elif word == "horovodrun":
            out += [sys.executable, "-m", "horovod.runner.launch"]
        elif word.startswith("/workspace/"):
            out.append(str(EXAMPLES / word.removeprefix("/workspace/")))
        else:
            out.append(word)
    return out


def _container(doc: dict, *replica: str) -> dict:
    spec = doc["spec"]
    for key in replica:
        spec = spec[key]
    return spec["template"]["spec"]["containers"][0]


def _mounted_secret(tmp: Path) -> str:
    """The Secret the manifests mount at /etc/khorovod: a file of the test."""
    key = tmp / "secret" / "key"
    key.parent.mkdir(exist_ok=True)
    key.write_text(SECRET + "\n")
    return str(key)


def _env(container: dict, tmp: Path, **operator: str) -> dict[str, str]:
    """The container's variables from the manifest, then those its operator adds."""
    env = child_env()
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"].replace("/etc/khorovod/key", _mounted_secret(tmp))
    env.update(operator)
    return env


def _results(stdout: str) -> dict[int, tuple[str, str]]:
    return {int(rank): (host, weights) for rank, host, weights in RESULT.findall(stdout)}


@pytest.fixture(scope="module")
def horovodrun_result():
    """The same script under horovodrun on this machine: what every flow must reproduce."""
    proc = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable,
                           str(EXAMPLES / "train.py")], capture_output=True, text=True, env=child_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = _results(proc.stdout)
    assert sorted(results) == [0, 1]
    return results[0][1]


def _run_pods(hosts: EmulatedHosts, pods: dict[str, tuple[list[str], dict[str, str]]],
              timeout: float = 150) -> str:
    """Start every pod's process at once in its namespace; all must succeed. Their output, joined."""
    procs = {name: subprocess.Popen(hosts.inside(name, argv), env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd=hosts.tmp)
             for name, (argv, env) in pods.items()}
    outputs = []
    try:
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
            assert proc.returncode == 0, f"pod {name} failed:\n{out}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return "\n".join(outputs)


@pytest.mark.timeout(240)
def test_mpijob(tmp_path, horovodrun_result):
    job = resource("mpijob.yaml", "MPIJob")
    name, spec = job["metadata"]["name"], job["spec"]
    workers = [f"{name}-worker-{i}.{name}-worker" for i in range(spec["mpiReplicaSpecs"]["Worker"]["replicas"])]
    launcher = f"{name}-launcher"
    with EmulatedHosts({launcher: "eth0", **{w: "eth0" for w in workers}}, tmp_path) as hosts:
        # The operator: ssh keys mounted in every pod (the client config names the key, as its
        # ~/.ssh does), sshd on 2222 in the workers as their command says, and the hostfile.
        ssh = RealSsh(tmp_path, identity_in_config=True)
        try:
            worker_command = _container(job, "mpiReplicaSpecs", "Worker")["command"]
            assert worker_command[:2] == ["/usr/sbin/sshd", "-De"] and worker_command[-1] == "2222"
            for worker in workers:
                ssh.serve(hosts, worker)
            hostfile = tmp_path / "hostfile"
            hostfile.write_text("".join(f"{w} slots={spec['slotsPerWorker']}\n" for w in workers))
            container = _container(job, "mpiReplicaSpecs", "Launcher")
            argv = [str(hostfile) if word == "/etc/mpi/hostfile" else word for word in container["command"]]
            env = _env(container, tmp_path)
            env["PATH"] = ssh.env_path(env["PATH"])
            out = _run_pods(hosts, {launcher: (_local_command(argv), env)})
        finally:
            ssh.close()
    results = _results(out)
    assert sorted(results) == [0, 1], out
    # Each rank ran in its worker pod, and trained as under horovodrun here.
    assert {host for host, _ in results.values()} == {w.split(".")[0] for w in workers}, out
    assert {weights for _, weights in results.values()} == {horovodrun_result}, out


@pytest.mark.timeout(240)
def test_pytorchjob(tmp_path, horovodrun_result):
    job = resource("pytorchjob.yaml", "PyTorchJob")
    name = job["metadata"]["name"]
    replicas = [("Master", f"{name}-master-0"), ("Worker", f"{name}-worker-0")]
    with EmulatedHosts({pod: "eth0" for _, pod in replicas}, tmp_path) as hosts:
        pods = {}
        for rank, (kind, pod) in enumerate(replicas):
            container = _container(job, "pytorchReplicaSpecs", kind)
            assert container["name"] == "pytorch"
            # What the training operator sets in every pod (MASTER_PORT: its default port, 23456).
            env = _env(container, tmp_path, MASTER_ADDR=f"{name}-master-0", MASTER_PORT="23456",
                       WORLD_SIZE="2", RANK=str(rank), PYTHONUNBUFFERED="1")
            pods[pod] = (_local_command(container["command"]), env)
        out = _run_pods(hosts, pods)
    results = _results(out)
    assert sorted(results) == [0, 1], out
    assert {host for host, _ in results.values()} == {pod for _, pod in replicas}, out
    assert {weights for _, weights in results.values()} == {horovodrun_result}, out


@pytest.mark.timeout(240)
def test_indexed_job(tmp_path, horovodrun_result):
    job = resource("indexed-job.yaml", "Job")
    service = resource("indexed-job.yaml", "Service")["metadata"]["name"]
    name = job["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["template"]["spec"]["subdomain"] == service
    pods = [f"{name}-{index}.{service}" for index in range(job["spec"]["completions"])]
    container = job["spec"]["template"]["spec"]["containers"][0]
    rank_source = next(item for item in container["env"] if item["name"] == "RANK")["valueFrom"]["fieldRef"]
    assert rank_source["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    with EmulatedHosts({pod: "eth0" for pod in pods}, tmp_path) as hosts:
        # Kubernetes gives each pod its index (the annotation, and JOB_COMPLETION_INDEX).
        out = _run_pods(hosts, {pod: (_local_command(container["command"]),
                                      _env(container, tmp_path, RANK=str(index), JOB_COMPLETION_INDEX=str(index)))
                                for index, pod in enumerate(pods)})
    results = _results(out)
    assert sorted(results) == [0, 1], out
    assert {host for host, _ in results.values()} == {pod.split(".")[0] for pod in pods}, out
    assert {weights for _, weights in results.values()} == {horovodrun_result}, out


FAKE_KUBECTL = '''#!{python}
"""Stands in for kubectl in the launcher pod: the pods the emulation runs, through the jsonpath
template of the discovery script (only what that script asks for is understood)."""
import sys
args = sys.argv[1:]
assert args[:2] == ["get", "pods"], args
assert "training.kubeflow.org/job-name={job},training.kubeflow.org/job-role=worker" in args, args
assert "--field-selector=status.phase=Running" in args, args
template = args[args.index("-o") + 1].removeprefix("jsonpath=")
item = template.removeprefix("{{range .items[*]}}").removesuffix("{{end}}")
for pod in open({running!r}).read().split():
    sys.stdout.write(item.replace("{{.metadata.name}}", pod).replace('{{"\\\\n"}}', "\\n"))
'''


@pytest.mark.timeout(300)
def test_elastic_mpijob_with_its_discovery_script(tmp_path):
    job = resource("elastic-mpijob.yaml", "MPIJob")
    name, spec = job["metadata"]["name"], job["spec"]
    service = f"{name}-worker"
    workers = [f"{name}-worker-{i}" for i in range(spec["mpiReplicaSpecs"]["Worker"]["replicas"])]
    launcher = f"{name}-launcher"
    script = tmp_path / "discover_hosts.sh"
    script.write_text(resource("elastic-mpijob.yaml", "ConfigMap")["data"]["discover_hosts.sh"])
    script.chmod(0o755)
    running = tmp_path / "running-pods"
    running.write_text("\n".join(workers) + "\n")
    kubectl_bin = tmp_path / "kubectl-bin"
    kubectl_bin.mkdir()
    kubectl = kubectl_bin / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable, job=name, running=str(running)))
    kubectl.chmod(0o755)
    with EmulatedHosts({launcher: "eth0", **{f"{w}.{service}": "eth0" for w in workers}}, tmp_path) as hosts:
        ssh = RealSsh(tmp_path, identity_in_config=True)
        try:
            for worker in workers:
                ssh.serve(hosts, f"{worker}.{service}")
            container = _container(job, "mpiReplicaSpecs", "Launcher")
            argv = [str(script) if word == "/etc/khorovod/discover_hosts.sh" else word for word in container["command"]]
            env = _env(container, tmp_path)
            env["PATH"] = os.pathsep.join([str(kubectl_bin), ssh.env_path(env["PATH"])])
            out = _run_pods(hosts, {launcher: (_local_command(argv), env)}, timeout=240)
        finally:
            ssh.close()
    finished = re.findall(r"rank (\d) on (\S+): finished 20 steps with 2 workers", out)
    assert sorted(rank for rank, _ in finished) == ["0", "1"], out
    assert {host for _, host in finished} == set(workers), out
