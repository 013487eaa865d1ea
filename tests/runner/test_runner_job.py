"""The job's pure parts (worker environment, failure summary, ssh command) and the ssh path itself.

The ssh path runs for real against a stand-in `ssh` on PATH that executes the remote command
locally, so the secret-over-stdin hand-over and the remote environment are exercised end to end.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import stat
import sys
import textwrap

import pytest

from horovod.runner import network
from horovod.runner.hosts import SlotInfo
from horovod.runner.job import worker_env
from horovod.runner.report import WorkerFailure, describe_returncode, exit_status, format_failure
from horovod.runner.launchers.ssh import ssh_argv
from runner_helpers import child_env, horovodrun

pytestmark = pytest.mark.timeout(20)

SLOT = SlotInfo(hostname="node7", rank=5, local_rank=1, cross_rank=2, size=8, local_size=2, cross_size=4)


def test_worker_env_layers_and_filters():
    base = {"PATH": "/bin", "OLDPWD": "/x", "CUDA_VISIBLE_DEVICES": "0", "BASH_FUNC_x%%": "f",
            "_HOROVOD_SECRET_KEY": "old", "HOROVOD_FUSION_THRESHOLD": "1", "HOROVOD_RANK": "99"}
    env = worker_env(base, {"HOROVOD_FUSION_THRESHOLD": "2"}, SLOT, "10.0.0.1", 4242)
    assert env["PATH"] == "/bin"
    assert not {"OLDPWD", "CUDA_VISIBLE_DEVICES", "BASH_FUNC_x%%", "_HOROVOD_SECRET_KEY"} & set(env)
    assert env["HOROVOD_FUSION_THRESHOLD"] == "2"  # flags beat the launcher's environment
    assert {k: env[k] for k in env if k.startswith("HOROVOD_") and k != "HOROVOD_FUSION_THRESHOLD"} == {
        "HOROVOD_HOSTNAME": "node7", "HOROVOD_RANK": "5", "HOROVOD_SIZE": "8",
        "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "2",
        "HOROVOD_CROSS_SIZE": "4", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "4242", "HOROVOD_CONTROLLER": "gloo", "HOROVOD_BOOTSTRAP": "env"}
    assert env["PYTHONUNBUFFERED"] == "1"
    # The launcher says which bootstrap it means, whatever the worker would otherwise infer.
    inside_a_pod = worker_env({**base, "HOROVOD_BOOTSTRAP": "torchrun", "RANK": "1", "WORLD_SIZE": "4"}, {}, SLOT,
                              "10.0.0.1", 4242)
    assert inside_a_pod["HOROVOD_BOOTSTRAP"] == "env"
    assert worker_env(base, {"HOROVOD_BOOTSTRAP": "store"}, SLOT, "10.0.0.1", 4242)["HOROVOD_BOOTSTRAP"] == "store"


def test_return_codes():
    assert describe_returncode(3) == "exit code 3"
    assert describe_returncode(-9) == "killed by signal SIGKILL"
    assert (exit_status(3), exit_status(-15)) == (3, 143)


def test_failure_summary_with_stderr_only():
    text = format_failure(WorkerFailure(5, "node7", 1, 2, stderr_tail=("oops", "bad")))
    assert text.splitlines() == [
        "Horovod detected that one or more processes exited with non-zero status, so the job was "
        "stopped. The first process to fail was:",
        "    rank 5 on host node7 (local rank 1): exit code 2",
        "Last 2 lines of rank 5's stderr:",
        "    oops",
        "    bad",
    ]


def test_failure_summary_prefers_the_reported_exception():
    report = "ValueError: x\nTraceback (most recent call last):\n  File \"t.py\", line 1\nValueError: x\n"
    tail = ("Traceback (most recent call last):", '  File "t.py", line 1', "ValueError: x")
    text = format_failure(WorkerFailure(0, "a", 0, 1, tail, report, other_reporting_ranks=(1, 3)))
    assert "Root cause, the exception rank 0 reported:\n    ValueError: x" in text
    assert "stderr" not in text  # the tail only repeats the report
    assert text.endswith("Other ranks that reported an exception: 1, 3.")
    extra = format_failure(WorkerFailure(0, "a", 0, 1, ("warning: disk full", *tail), report))
    assert "Last 4 lines of rank 0's stderr" in extra


def test_failure_summary_without_any_output():
    assert "Rank 0 wrote nothing to stderr." in format_failure(WorkerFailure(0, "a", 0, -9))


def test_ssh_command_carries_env_but_never_the_secret():
    argv = ssh_argv("node7", ["python", "train.py", "--name", "a b"], {"HOROVOD_RANK": "5", "X": "it's"},
                    "/work dir", port=2222, identity_file="/k/id")
    assert argv[:9] == ["ssh", "-o", "PasswordAuthentication=no", "-o", "StrictHostKeyChecking=no",
                        "-p", "2222", "-i", "/k/id"]
    assert argv[9] == "node7"
    remote = argv[10]
    assert remote.startswith("cd '/work dir' >/dev/null 2>&1; ")
    assert "read -r _HOROVOD_SECRET_KEY" in remote
    assert shlex.split(remote.split("exec env ", 1)[1]) == [
        "HOROVOD_RANK=5", "X=it's", "python", "train.py", "--name", "a b", "</dev/null", "3<&-"]


def test_ssh_gives_up_on_a_silent_session_after_about_the_failure_detection_time():
    argv = ssh_argv("node7", ["true"], {}, "/", alive_seconds=5)
    options = " ".join(argv[:-2])
    assert "-o ServerAliveInterval=2 -o ServerAliveCountMax=3" in options  # about 6 s without an answer
    assert "ServerAlive" not in " ".join(ssh_argv("node7", ["true"], {}, "/", alive_seconds=0))


def test_local_host_detection():
    assert network.is_local_host("localhost")
    assert network.is_local_host("127.0.0.2")
    assert network.is_local_host(socket.gethostname())
    assert not network.is_local_host("khorovod-no-such-host.invalid")


FAKE_SSH = textwrap.dedent("""\
    #!/bin/sh
    # Stand-in for ssh: log the argv, skip the options and the host, run the command here.
    printf '%s\\n' "$*" >> "$KHVD_SSH_LOG"
    while [ $# -gt 2 ]; do
      case "$1" in -o|-p|-i) shift 2;; *) break;; esac
    done
    shift
    exec sh -c "$1"
    """)


def test_remote_hosts_go_through_ssh_with_the_secret_on_stdin(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "ssh.log"
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = ("import json, os; print(json.dumps({'cwd': os.getcwd(), 'key': os.environ['_HOROVOD_SECRET_KEY'],"
              " 'host': os.environ['HOROVOD_HOSTNAME'], 'rank': os.environ['HOROVOD_RANK'],"
              " 'cross': os.environ['HOROVOD_CROSS_RANK'], 'addr': os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR']}))")
    env = child_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", KHVD_SSH_LOG=str(log))
    proc = horovodrun("-np", "2", "-H", "localhost:1,khorovod-remote.invalid:1", "-p", "2200",
                      sys.executable, "-c", script, env=env, cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    lines = {int(line[1]): json.loads(line.split(":", 1)[1]) for line in proc.stdout.splitlines()}
    local, remote = lines[0], lines[1]
    assert remote["host"] == "khorovod-remote.invalid" and remote["cross"] == "1"
    assert remote["cwd"] == str(workdir)
    assert remote["key"] == local["key"] and len(remote["key"]) == 64
    assert local["addr"] == remote["addr"] != ""
    ssh_calls = log.read_text()
    assert "khorovod-remote.invalid" in ssh_calls and "-p 2200" in ssh_calls
    assert remote["key"] not in ssh_calls
