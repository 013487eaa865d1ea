"""A launcher that dies outright (`kill -9`) takes its workers with it, within 5 s.

The workers run in sessions of their own, so nothing in the kernel ties them to the launcher;
the job's orphan guard does (`horovod.runner.launchers.orphans`). To see the workers' exit
status, which only their parent can, the test runs the job under a small harness process that
is a child subreaper (`PR_SET_CHILD_SUBREAPER`): when the launcher dies, its orphans become the
harness's children, and the harness reaps them and reports how and when each went.

For remote workers the end of the ssh session does the same (the watcher that `ssh_argv` puts in
the remote shell): tested here by running that remote shell under `setsid`, as sshd does, and
ending its stdin, which is what sshd does when the client's connection goes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from leftovers import shm_segments, wait_for_no_processes
from multirank import child_env
from horovod.runner.launchers.ssh import ssh_argv

BOUND_SECONDS = 5.0  # the promise: every worker gone within 5 s of its launcher

WORKER = r'''
import json, os, sys, time
import numpy as np
import horovod.numpy as hvd

hvd.init()
hvd.allreduce(np.ones(1 << 16, np.float32), name="warmup")  # shared memory and sockets in use
print("READY " + json.dumps({"rank": hvd.rank(), "pid": os.getpid()}), flush=True)
deadline = time.time() + 60
while time.time() < deadline:  # a long job that never needs the launcher again
    time.sleep(0.05)
'''

# Runs the launcher, kills it once every worker is ready, and reaps the orphans it inherits.
HARNESS = r'''
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans below us become our children
argv, np_ = json.loads(sys.argv[1]), int(sys.argv[2])
launcher = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(sys.argv[3], "wb"))
ready = {}
deadline = time.monotonic() + 60
for line in launcher.stdout:
    text = line.decode(errors="replace")
    if "READY " in text:
        info = json.loads(text.split("READY ", 1)[1])
        ready[info["rank"]] = info["pid"]
    if len(ready) == np_ or time.monotonic() > deadline:
        break
killed = time.monotonic()
launcher.kill()
launcher.wait()
exits = {}
def reap(block):
    while True:  # every orphan (workers, the guard, a Spark driver's JVMs) ends as our child
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exits[pid] = [os.waitstatus_to_exitcode(status), time.monotonic() - killed]
while time.monotonic() < killed + 30 and not all(pid in exits for pid in ready.values()):
    reap(block=False)
    time.sleep(0.02)
print(json.dumps({"ready": ready, "exits": exits}), flush=True)
while True:  # whatever is left (nothing, for horovodrun) is not the workers' business: stop it
    children = [int(pid) for task in os.listdir("/proc/self/task")
                for pid in open(f"/proc/self/task/{task}/children").read().split()]
    if not children:
        break
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.05)
    reap(block=False)
'''


def _discovery(tmp_path: Path) -> str:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("driver", ["horovodrun", "elastic"])
def test_workers_exit_within_5_s_of_their_launcher_being_killed(tmp_path: Path, driver: str) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    elastic = ["--min-np", "2", "--host-discovery-script", _discovery(tmp_path)] if driver == "elastic" else []
    argv = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", *elastic, sys.executable, str(worker)]
    stderr = tmp_path / "launcher.stderr"
    done = subprocess.run([sys.executable, "-c", HARNESS, json.dumps(argv), "2", str(stderr)],
                          capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    workers = {int(rank): pid for rank, pid in report["ready"].items()}
    assert sorted(workers) == [0, 1], f"the workers never got ready:\n{stderr.read_text()}"
    exits = {int(pid): (code, seconds) for pid, (code, seconds) in report["exits"].items()}
    for rank, pid in workers.items():
        code, seconds = exits[pid]
        assert code != 0, f"rank {rank} exited 0 after its launcher died"
        assert seconds < BOUND_SECONDS, f"rank {rank} outlived its launcher by {seconds:.1f} s"
        print(f"{driver}: rank {rank} exited {code} {seconds:.2f} s after its launcher was killed")
    message = stderr.read_text()
    assert "the launcher (pid" in message and "exited without stopping its workers" in message, message
    assert "rank 0 on host localhost" in message and "rank 1 on host localhost" in message, message
    assert wait_for_no_processes(workers.values(), workers.values(), seconds=1.0) == []
    assert shm_segments(workers.values()) == []


def test_a_remote_worker_exits_when_its_ssh_session_ends(tmp_path: Path) -> None:
    """The remote half of `ssh_argv`, run as sshd runs it: a shell in a session of its own whose
    stdin is the session's. The worker has a child of its own: the whole group must go."""
    pids = tmp_path / "pids"
    script = ("import os, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
              "time.sleep(60)\n")
    remote = ssh_argv("node1", [sys.executable, "-c", script], {"PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                      str(tmp_path))[-1]
    shell = subprocess.Popen(["sh", "-c", remote], stdin=subprocess.PIPE, start_new_session=True)
    try:
        assert shell.stdin is not None
        shell.stdin.write(b"0123abcd\n")  # the secret, as the launcher sends it
        shell.stdin.flush()
        deadline = time.monotonic() + 30
        while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        worker, grandchild = map(int, pids.read_text().split())
        assert worker == shell.pid  # the worker replaced the shell: sshd's session leader
        time.sleep(0.5)
        assert shell.poll() is None, "the worker must run for as long as its session does"
        ended = time.monotonic()
        shell.stdin.close()  # the ssh session is gone
        assert shell.wait(timeout=BOUND_SECONDS) == -signal.SIGTERM
        assert wait_for_no_processes([grandchild], [shell.pid], seconds=BOUND_SECONDS) == []
        assert time.monotonic() - ended < BOUND_SECONDS
    finally:
        try:
            os.killpg(shell.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shell.wait()
