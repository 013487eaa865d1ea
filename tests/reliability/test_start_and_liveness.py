"""Bounded start-up and liveness checks: the launcher enforces --start-timeout and names the rank
that never joined; every TCP connection carries keepalive settings derived from
HOROVOD_FAILURE_DETECTION_SECONDS; and without any help from the test (no ignored SIGTERM), the
survivors of a crash still get to report it themselves before horovodrun stops them."""

from __future__ import annotations

import socket
import time

import pytest

from horovod.common import wire
from multirank import hvdrun


@pytest.mark.parametrize("seconds", [0.5, 1, 2, 3, 4, 5, 7.5, 10, 30, 120])
def test_keepalive_arithmetic_gives_up_after_about_the_setting(seconds: float) -> None:
    options = wire.keepalive_options(seconds)
    idle, interval, count = options["TCP_KEEPIDLE"], options["TCP_KEEPINTVL"], options["TCP_KEEPCNT"]
    assert min(idle, interval, count) >= 1  # the kernel refuses 0
    # Probing ends within a second of the setting (the kernel counts in whole seconds, at least 2).
    assert max(seconds, 2) - 1 <= idle + interval * count <= max(seconds, 2) + 1
    assert options["TCP_USER_TIMEOUT"] == max(1, int(seconds * 1000))


def test_liveness_checks_are_set_on_a_socket() -> None:
    with socket.socket() as sock:
        wire.enable_liveness_checks(sock, 10)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 10_000
    with socket.socket() as sock:
        wire.enable_liveness_checks(sock, 0)  # 0: the kernel's defaults
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0


SOCKET_OPTIONS = r'''
import socket
import numpy as np
import horovod.numpy as hvd
from horovod.common import basics
hvd.init()
hvd.allreduce(np.ones(2), name="x")
rt = basics.runtime()
mesh = getattr(rt.transport, "tcp", rt.transport)
def options(sock):
    get = lambda level, name: sock.getsockopt(level, getattr(socket, name))
    return [get(socket.SOL_SOCKET, "SO_KEEPALIVE")] + [
        get(socket.IPPROTO_TCP, name) for name in ("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT", "TCP_USER_TIMEOUT")]
report(mesh=options(mesh.peer(1 - hvd.rank()).sock), store=options(rt.rendezvous._sock))
'''


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux TCP options")
@pytest.mark.parametrize("setting,expected", [(None, [1, 2, 1, 3, 5000]), ("10", [1, 4, 2, 3, 10000]),
                                              ("0", [0])], ids=["default", "10s", "off"])
def test_every_connection_of_a_job_follows_the_setting(setting: str | None, expected: list[int]) -> None:
    env = {"HOROVOD_CPU_OPERATIONS": "tcp"}
    if setting is not None:
        env["HOROVOD_FAILURE_DETECTION_SECONDS"] = setting
    result = hvdrun(SOCKET_OPTIONS, np=2, env=env).check()
    for rank in (0, 1):
        for where in ("mesh", "store"):
            assert result.ranks[rank][where][:len(expected)] == expected, (where, result.ranks[rank])


def test_a_malformed_setting_is_refused_before_anything_starts() -> None:
    result = hvdrun("report(ran=True)", np=2, env={"HOROVOD_FAILURE_DETECTION_SECONDS": "soon"})
    assert result.returncode == 2 and not result.ranks
    assert "HOROVOD_FAILURE_DETECTION_SECONDS='soon' is not a number" in result.stderr


LATE = r'''
import os, time
import numpy as np
import horovod.numpy as hvd
if int(os.environ["HOROVOD_RANK"]) == 1:
    time.sleep(60)  # stuck before hvd.init(): slow storage, a deadlock, a host that never came up
started = time.monotonic()
try:
    hvd.init()
except hvd.HorovodInternalError as exc:
    report(error=str(exc), waited=time.monotonic() - started)
    raise
'''


def test_the_launcher_enforces_the_start_timeout_naming_the_rank_that_never_joined() -> None:
    started = time.monotonic()
    result = hvdrun(LATE, np=2, args=["--start-timeout", "2"], timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    summary = result.stderr[result.stderr.index("Horovod detected that one or more processes"):]
    assert "rank 1 on host localhost (local rank 1): did not join the job" in summary, summary
    assert "start timeout (2 s, --start-timeout or HOROVOD_START_TIMEOUT)" in summary
    error = result.ranks[0]["error"]
    assert "hvd.init() failed on rank 0: rank 1 on host localhost did not join the job" in error, error
    # Rank 0 waited the start timeout, not its own backstop (2 s later) nor the default 30 s.
    assert 2 <= result.ranks[0]["waited"] < 4, result.ranks[0]
    assert elapsed < 20, elapsed  # rank 1 sleeps 60 s: it was stopped


CRASH = r'''
import os, time
import numpy as np
import horovod.numpy as hvd
hvd.init()
hvd.allreduce(np.ones(4), name="warmup")
if hvd.rank() == 1:
    os.kill(os.getpid(), 9)
for step in range(1000):
    hvd.allreduce(np.ones(1 << 16, np.float32), name="grad")
'''


def test_survivors_report_the_failure_themselves_before_being_stopped() -> None:
    # A plain script: nothing ignores horovodrun's SIGTERM. The 2 s the launcher gives the other
    # ranks after the first failure is enough for them to raise and print their own error.
    result = hvdrun(CRASH, np=3)
    assert result.returncode == 128 + 9
    for rank in (0, 2):
        output = result.output_of(rank)
        assert "HorovodInternalError" in output and "rank 1 on host localhost" in output, output
        assert "allreduce.grad" in output
    summary = result.stderr[result.stderr.index("Horovod detected that one or more processes"):]
    assert "rank 1 on host localhost (local rank 1): killed by signal SIGKILL" in summary
    assert "Other ranks that reported an exception: 0, 2." in summary
