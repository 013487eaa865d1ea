"""Network faults between hosts, with real network namespaces standing in for machines.

Each test builds its own hosts: one namespace per host, each with a veth pair to a bridge in
this namespace (where horovodrun and its rendezvous store run), on a private 10.x subnet. A
stand-in `ssh` on PATH maps host addresses to namespaces and runs the remote command with
`ip netns exec`, so ranks on different hosts talk over TCP through the bridge, exactly as over
a network. `ip link set ... down` on a host's bridge port then isolates that host: its peers see
silence, not a closed connection, which only the kernel's liveness checks can detect
(HOROVOD_FAILURE_DETECTION_SECONDS). Everything is removed afterwards, however a test ends.

Also here: which addresses a job listens on (loopback only for a one-host job).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from engines import engine_unavailable
from leftovers import listening_addresses, wait_for_no_processes
from multirank import REPO, child_env, hvdrun
from netns_ssh import FAKE_SSH

DETECTION_SECONDS = 3.0
# A cut host is noticed after about DETECTION_SECONDS of silence (keepalive probes, or data left
# unacknowledged); allow as much again for the process to report it on a loaded 2-core machine.
BOUND_SECONDS = 2 * DETECTION_SECONDS + 1


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@dataclass
class Hosts:
    """Two emulated hosts: their addresses, namespaces and the bridge ports that connect them."""

    prefix: str
    bridge: str
    launcher_address: str
    addresses: tuple[str, str]
    namespaces: tuple[str, str]
    ports: tuple[str, str]  # this namespace's end of each host's veth pair
    bin_dir: Path

    def cut(self, host: int) -> None:
        """Isolate a host: from now on, nothing it sends arrives and nothing reaches it."""
        _ip("link", "set", self.ports[host], "down")

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = child_env(extra)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env['PATH']}"
        env["PYTHONPATH"] = f"{SUPPORT}{os.pathsep}{env['PYTHONPATH']}"
        return env




_fixtures_made: list[None] = []  # a fresh name and subnet for every test's hosts


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    if os.geteuid() != 0:
        engine_unavailable("network namespaces need root")
    if shutil.which("ip") is None:
        engine_unavailable("the `ip` tool (iproute2) is not installed")
    _fixtures_made.append(None)
    tag = f"{os.getpid() % 10000}{len(_fixtures_made) % 10}"
    subnet = f"10.{200 + os.getpid() % 50}.{(os.getpid() + len(_fixtures_made)) % 250}"
    made = Hosts(prefix=tag, bridge=f"khb{tag}", launcher_address=f"{subnet}.1",
                 addresses=(f"{subnet}.2", f"{subnet}.3"), namespaces=(f"khvd{tag}a", f"khvd{tag}b"),
                 ports=(f"kh{tag}a", f"kh{tag}b"), bin_dir=tmp_path / "bin")
    try:
        probe = _ip("netns", "add", made.namespaces[0], check=False)
        if probe.returncode != 0:
            engine_unavailable(f"cannot create a network namespace: {probe.stderr.strip()}")
        _ip("netns", "add", made.namespaces[1])
        _ip("link", "add", made.bridge, "type", "bridge")
        _ip("addr", "add", f"{made.launcher_address}/24", "dev", made.bridge)
        _ip("link", "set", made.bridge, "up")
        for ns, port, address in zip(made.namespaces, made.ports, made.addresses):
            inside = f"{port}i"
            _ip("link", "add", port, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", port, "master", made.bridge)
            _ip("link", "set", port, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        made.bin_dir.mkdir()
        cases = "\n".join(f"  {address}) ns={ns};;" for address, ns in zip(made.addresses, made.namespaces))
        ssh = made.bin_dir / "ssh"
        ssh.write_text(FAKE_SSH.format(cases=cases))
        ssh.chmod(0o755)
        yield made
    finally:
        for port in made.ports:
            _ip("link", "del", port, check=False)  # takes the other end of the pair with it
        for ns in made.namespaces:
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", made.bridge, check=False)
        leftovers = _ip("netns", "list", check=False).stdout
        assert not any(ns in leftovers for ns in made.namespaces)


TRAIN = r'''
import os, signal, sys, threading, time
import numpy as np

signal.signal(signal.SIGTERM, signal.SIG_IGN)  # report what we noticed ourselves (horovodrun SIGKILLs later)
import horovod.numpy as hvd

hvd.init()
rank = hvd.rank()
report(pid=os.getpid(), listening=stop_watching())
error = caught = None
step = 0
try:
    while True:
        hvd.allreduce(np.ones(1 << 18, np.float32), name="grad", op=hvd.Sum)  # 1 MiB: the ring
        step += 1
        if step == 20:
            report(ready=time.time())
except Exception as exc:
    caught, error = time.time(), f"{type(exc).__name__}: {exc}"
    report(error=error, caught=caught, steps=step)
    raise
'''

# Records every address this process listens on while hvd.init() runs; stop_watching() returns
# them. A rank's data-plane listener lives only until its higher ranks have connected, so the last
# rank starts a second late: every other rank's listener is then up long enough to be seen.
WATCH_LISTENERS = r'''
import os, sys, threading, time
if int(os.environ["HOROVOD_RANK"]) == int(os.environ["HOROVOD_SIZE"]) - 1:
    time.sleep(1)
from leftovers import listening_addresses
_listening, _stop = set(), threading.Event()
def _watch():
    while not _stop.is_set():
        _listening.update(address for address, _ in listening_addresses(os.getpid()))
        time.sleep(0.0005)
_watcher = threading.Thread(target=_watch, daemon=True)
_watcher.start()
def stop_watching():
    _stop.set()
    _watcher.join()
    return sorted(_listening)
'''
NO_WATCH = "def stop_watching():\n    return None\n"
SUPPORT = str(Path(__file__).resolve().parents[1] / "support")


def _start(hosts: Hosts, code: str, extra: list[str], env: dict[str, str],
           per_host: int = 1) -> tuple[subprocess.Popen[str], Path]:
    tmp = Path(tempfile.mkdtemp())
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(code))
    argv = [sys.executable, "-m", "horovod.runner.launch", "-np", str(2 * per_host), "-H",
            f"{hosts.addresses[0]}:{per_host},{hosts.addresses[1]}:{per_host}", *extra, sys.executable, str(script)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                            env=hosts.env(env))
    return proc, tmp


def _parse(stdout: str) -> dict[int, dict]:
    import json
    import re

    ranks: dict[int, dict] = {}
    for match in re.finditer(r"^\[(\d+)\]<stdout>:RESULT:(.*)$", stdout, re.M):
        ranks.setdefault(int(match[1]), {}).update(json.loads(match[2]))
    return ranks


PRELUDE = '''\
import json as _json
def report(**values):
    print("RESULT:" + _json.dumps(values, default=str), flush=True)
'''


@pytest.mark.parametrize("per_host", [1, 2], ids=["1-rank-per-host", "2-ranks-per-host"])
def test_a_host_cut_off_mid_training_fails_every_rank_within_the_bound_naming_the_peer(
        hosts: Hosts, per_host: int) -> None:
    # Two ranks per host: shared memory within a host, TCP between them (hierarchical allreduce).
    size = 2 * per_host
    proc, _ = _start(hosts, PRELUDE + WATCH_LISTENERS + TRAIN, [],
                     {"HOROVOD_FAILURE_DETECTION_SECONDS": str(DETECTION_SECONDS)}, per_host)
    stdout = ""
    try:
        # Wait until every rank is training, then isolate host b.
        deadline = time.monotonic() + 60
        ready: set[int] = set()
        assert proc.stdout is not None
        while len(ready) < size:
            assert time.monotonic() < deadline, "the job did not start training"
            line = proc.stdout.readline()
            assert line, f"horovodrun ended early: {proc.stderr.read() if proc.stderr else ''}"
            stdout += line
            if '"ready"' in line:
                ready.add(int(line[1:line.index("]")]))
        launcher_listens = listening_addresses(proc.pid)
        cut_at = time.time()
        hosts.cut(1)
        out, err = proc.communicate(timeout=60)
        stdout += out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ranks = _parse(stdout)
    assert proc.returncode != 0, stdout + err
    # The store listens on the bridge address only; each rank's data listener on its own host's.
    assert launcher_listens and {address for address, _ in launcher_listens} == {hosts.launcher_address}
    for rank in range(size):
        host = rank // per_host
        # The last rank may be too quick to see: nobody has to connect to it.
        seen = ranks[rank]["listening"]
        assert seen == [hosts.addresses[host]] or (rank == size - 1 and seen == []), (rank, seen)
        other = hosts.addresses[1 - host]
        error = ranks[rank]["error"]
        assert error is not None and error.startswith("HorovodInternalError: "), error
        # It names a rank on the other side of the cut, and its host, as unreachable.
        assert re.search(rf"rank \d+ on host {re.escape(other)} stopped answering", error), error
        assert ranks[rank]["caught"] - cut_at < BOUND_SECONDS, (ranks[rank]["caught"] - cut_at, error)
    summary = err[err.index("Horovod detected that one or more processes"):]
    assert "The first process to fail was:" in summary and "exit code 1" in summary
    assert wait_for_no_processes([values["pid"] for values in ranks.values()]) == []


def test_a_host_unreachable_at_start_is_named_within_the_start_timeout(hosts: Hosts) -> None:
    hosts.cut(1)
    started = time.monotonic()
    proc, _ = _start(hosts, PRELUDE + NO_WATCH + TRAIN, ["--start-timeout", "3"],
                     {"HOROVOD_FAILURE_DETECTION_SECONDS": str(DETECTION_SECONDS)})
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - started
    ranks = _parse(out)
    assert proc.returncode != 0
    summary = err[err.index("Horovod detected that one or more processes"):]
    assert f"rank 1 on host {hosts.addresses[1]}" in summary, summary
    error = ranks[0]["error"] if 0 in ranks else None
    assert error is None or f"rank 1 on host {hosts.addresses[1]}" in error  # rank 0 may be stopped first
    # Start-up (interpreter and imports), the 3 s start timeout, the stop: well under a minute.
    assert elapsed < 30, elapsed


def test_a_one_host_job_listens_on_loopback_only() -> None:
    code = WATCH_LISTENERS + r'''
import numpy as np
import horovod.numpy as hvd
hvd.init()
hvd.allreduce(np.ones(4), name="x")
report(listening=stop_watching(), launcher=listening_addresses(os.getppid()))
'''
    result = hvdrun(code, np=3, env={"PYTHONPATH": f"{SUPPORT}{os.pathsep}{REPO}"}).check()
    for rank in (0, 1, 2):
        values = result.ranks[rank]
        assert values["listening"] == ["127.0.0.1"] or (rank == 2 and values["listening"] == []), values
        assert values["launcher"] and {address for address, _ in values["launcher"]} == {"127.0.0.1"}
