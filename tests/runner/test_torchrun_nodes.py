"""torchrun across two emulated nodes (network namespaces with their own host names), with the
c10d rendezvous: `--nnodes MIN:MAX` and `--max-restarts` re-form a khorovod job after a failure,
with both nodes when both come back, and with the one left when the other node is gone.

Each node runs `torchrun --nnodes 1:2 --nproc_per_node 1 --max-restarts 1 --rdzv-backend c10d
--rdzv-endpoint nodea:<port>`, as the torchrun documentation shows for elastic jobs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from multirank import child_env
from netns import EmulatedHosts

TRAIN = """\
import os, socket, sys, time, torch
import horovod.torch as hvd
hvd.init()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
out = f"attempt{attempt}.{socket.gethostname()}"
open(out + ".joined", "w").write(f"{hvd.rank()} {hvd.size()}")
if attempt == 0 and MODE == "fail" and hvd.rank() == 1:
    sys.exit(3)  # the first attempt loses a worker after init()
try:
    while True:
        total = hvd.allreduce(torch.ones(2), op=hvd.Sum)
        if attempt > 0 or MODE == "fail":
            break
        time.sleep(0.05)  # MODE == "lose a node": attempt 0 runs until a peer is gone
except Exception as exc:
    print("attempt", attempt, "ended:", type(exc).__name__, exc, flush=True)
    sys.exit(4)
open(out + ".result", "w").write(f"{hvd.rank()} {hvd.size()} {total.tolist()}")
"""


@pytest.fixture
def nodes(tmp_path):
    pytest.importorskip("torch")
    with EmulatedHosts({"nodea": "eth0", "nodeb": "eth0"}, tmp_path) as hosts:
        yield hosts


def _start(hosts: EmulatedHosts, mode: str, port: int) -> dict[str, subprocess.Popen[str]]:
    script = hosts.tmp / "train.py"
    script.write_text(f"MODE = {mode!r}\n" + TRAIN)
    torchrun = str(Path(sys.executable).parent / "torchrun")
    secret = hosts.tmp / "secret"
    secret.write_text("7a" * 32)
    env = child_env({"HOROVOD_SECRET_KEY_FILE": str(secret), "HOROVOD_START_TIMEOUT": "40"})
    argv = [torchrun, "--nnodes", "1:2", "--nproc_per_node", "1", "--max-restarts", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"nodea:{port}", "--rdzv-id", "khorovod",
            "--rdzv-conf", "last_call_timeout=5", str(script)]
    return {name: subprocess.Popen(hosts.inside(name, argv), env=env, cwd=hosts.tmp, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            for name in ("nodea", "nodeb")}


def _finish(procs: dict[str, subprocess.Popen[str]], timeout: float) -> dict[str, tuple[int, str]]:
    done = {}
    try:
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=timeout)
            done[name] = (proc.returncode, out)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return done


def _read(tmp: Path, pattern: str) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(tmp.glob(pattern))}


@pytest.mark.timeout(240)
def test_max_restarts_re_forms_the_job_on_both_nodes(nodes):
    done = _finish(_start(nodes, "fail", 29611), timeout=180)
    for name, (code, out) in done.items():
        assert code == 0, f"{name}:\n{out}"
    # Attempt 0 formed one job of two nodes; attempt 1 formed it again and finished.
    assert sorted(_read(nodes.tmp, "attempt0.*.joined").values()) == ["0 2", "1 2"]
    assert sorted(_read(nodes.tmp, "attempt1.*.result").values()) == ["0 2 [2.0, 2.0]", "1 2 [2.0, 2.0]"]


@pytest.mark.timeout(240)
def test_nnodes_min_max_goes_on_with_the_node_left(nodes):
    procs = _start(nodes, "lose a node", 29612)
    deadline = time.monotonic() + 120
    while len(_read(nodes.tmp, "attempt0.*.joined")) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs.values()), \
            {name: p.poll() for name, p in procs.items()}
        time.sleep(0.2)
    # Node b goes away: everything in it (torchrun runs its worker in a session of its own).
    for pid in subprocess.run(["ip", "netns", "pids", nodes.host("nodeb").namespace], capture_output=True,
                              text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    procs["nodeb"].wait()
    done = _finish({"nodea": procs["nodea"]}, timeout=150)
    code, out = done["nodea"]
    assert code == 0, out
    assert "attempt 0 ended:" in out  # the survivor's collective failed, naming the lost peer
    # torchrun restarted node a's worker; the rendezvous closed with 1 node (the minimum).
    assert _read(nodes.tmp, "attempt1.*.result") == {"attempt1.nodea.result": "0 1 [1.0, 1.0]"}
