"""Strangers and garbage against the rendezvous store: refused, logged, and the job goes on."""

import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from horovod.common import wire
from horovod.common.rendezvous import RendezvousClient, RendezvousServer
from multirank import child_env

JOB = textwrap.dedent(r'''
    import os, sys, time
    import numpy as np
    import horovod.numpy as hvd
    hvd.init()
    if hvd.rank() == 0:
        print("PORT", os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"], flush=True)
    stop_file, wrong = sys.argv[1], 0
    for step in range(100000):
        out = hvd.allreduce(np.full(1000, step, np.int64), op=hvd.Sum, name="x")
        wrong += int(not np.all(out == 2 * step))
        done = hvd.allreduce(np.array([os.path.exists(stop_file)]), op=hvd.Max, name="stop")
        if done[0]:
            break
    print("STEPS", step, "WRONG", wrong, flush=True)
''')


def _attack(port: int, payload: bytes) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(payload)
            sock.settimeout(0.05)
            try:
                sock.recv(4096)
            except OSError:
                pass
    except OSError:
        pass


def test_a_running_job_survives_strangers_garbage_and_oversized_frames():
    with tempfile.TemporaryDirectory() as tmp:
        script, stop = Path(tmp) / "job.py", Path(tmp) / "stop"
        script.write_text(JOB)
        proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable,
                                 str(script), str(stop)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=child_env())
        try:
            port = None
            while port is None:
                line = proc.stdout.readline()
                assert line, proc.stderr.read()
                if "PORT" in line:
                    port = int(line.split()[-1])
            rng = random.Random(7)
            payloads = [wire.MAGIC + os.urandom(32),                      # right protocol, no key
                        wire.MAGIC + os.urandom(32) + os.urandom(32),     # forged proof
                        b"GET /global/0 HTTP/1.1\r\n\r\n",                # Horovod's HTTP store API
                        wire.MAGIC[:3], b"", struct.pack("<Q", 1 << 62)]
            payloads += [rng.randbytes(rng.randint(1, 300)) for _ in range(300)]
            for payload in payloads:
                _attack(port, payload)
            stop.touch()
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 0, err
    assert "WRONG 0" in out
    assert "refused connection" in err        # every stranger is logged by the launcher's store


@pytest.fixture(scope="module")
def server_and_key():
    key = wire.new_secret_key()
    server = RendezvousServer(key)
    server.start()
    yield server, key
    server.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=64).map(lambda b: ("raw", b)),
    st.tuples(st.sampled_from(["put", "get", "delete", "keys", "nope", ""]),
              st.lists(st.one_of(st.none(), st.integers(-2**63, 2**64 - 1), st.text(max_size=8), st.binary(max_size=8),  # messages carry 64-bit integers
                                 st.floats(allow_nan=True)), max_size=4)).map(lambda t: ("msg", (t[0], *t[1])))))
def test_authenticated_malformed_requests_never_break_the_store(server_and_key, request_):
    server, key = server_and_key
    sock = socket.create_connection(server.address, timeout=5)
    try:
        wire.handshake(sock, key, initiator=True)
        kind, body = request_
        frame = body if kind == "raw" else wire.encode(body)
        sock.sendall(wire._LEN.pack(len(frame)) + frame)
        sock.settimeout(2)
        try:
            sock.recv(4096)
        except OSError:
            pass
    finally:
        sock.close()
    client = RendezvousClient(*server.address, key)   # the store still serves honest clients
    client.put("s", "k", b"v")
    assert client.get("s", "k", 1.0) == b"v"
    client.close()
