"""The launcher seam: launchers chosen by name, each starting a worker the job can wait for and stop."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from horovod.runner import launchers
from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers import LaunchContext, registry
from horovod.runner.launchers.local import LocalLauncher
from horovod.runner.launchers.ssh import SshLauncher
from runner_helpers import child_env

pytestmark = pytest.mark.timeout(30)

SLOT = SlotInfo(hostname="localhost", rank=0, local_rank=0, cross_rank=0, size=1, local_size=1, cross_size=1)


def context(*command: str) -> LaunchContext:
    return LaunchContext(command=command, secret_hex="ab" * 32, cwd=".", launcher_env=child_env())


def test_launchers_are_built_by_name():
    ctx = context("true")
    assert isinstance(launchers.create("local", ctx), LocalLauncher)
    assert isinstance(launchers.create("ssh", ctx), SshLauncher)
    assert registry.names() == ["local", "ray", "spark", "spark_elastic", "ssh"]
    with pytest.raises(ValueError, match="unknown launcher 'carrier-pigeon'; choose one of: local, ray, spark, spark_elastic, ssh"):
        launchers.create("carrier-pigeon", ctx)


def test_this_machine_runs_local_processes_other_hosts_ssh():
    assert launchers.default_name("localhost") == "local"
    assert launchers.default_name("khorovod-no-such-host.invalid") == "ssh"


def test_the_registry_imports_a_launcher_only_when_it_is_asked_for():
    probe = ("import sys, horovod.runner.job; "
             "print(sorted(m for m in sys.modules if m.startswith('horovod.runner.launchers.')))")
    out = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True,
                         timeout=30, check=True).stdout
    assert "launchers.local" not in out and "launchers.ssh" not in out and "launchers.registry" in out


def test_a_local_worker_gets_the_env_and_the_secret_and_reports_its_exit(capsys):
    script = "import os, sys; print(os.environ['KHVD_X'], os.environ['_HOROVOD_SECRET_KEY']); sys.exit(3)"
    worker = LocalLauncher(context(sys.executable, "-c", script)).start(SLOT, child_env(KHVD_X="x"))
    assert worker.wait() == 3 and worker.returncode == 3
    worker.join_output(5.0)
    assert capsys.readouterr().out == f"[0]<stdout>:x {'ab' * 32}\n"


def test_stop_all_ends_workers_that_do_not_exit():
    worker = LocalLauncher(context(sys.executable, "-c", "import time; time.sleep(60)")).start(SLOT, child_env())
    assert worker.wait(timeout=0.1) is None and worker.returncode is None
    launchers.stop_all([worker], grace_seconds=5.0)
    assert worker.returncode == -signal.SIGTERM
