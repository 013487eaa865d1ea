"""Strangers on a worker's data port during start-up: refused and logged, and a silent one holds
the start-up for at most HOROVOD_FAILURE_DETECTION_SECONDS, not the whole start timeout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from horovod.common import wire
from leftovers import listening_addresses
from multirank import child_env

JOB = textwrap.dedent(r'''
    import os, sys, time
    import numpy as np
    if os.environ["HOROVOD_RANK"] == "1":
        time.sleep(3)  # rank 0 listens for it meanwhile: the strangers come first
    print("PID", os.getpid(), flush=True)
    import horovod.numpy as hvd
    started = time.monotonic()
    hvd.init()
    total = hvd.allreduce(np.arange(4.0), op=hvd.Sum, name="x")
    print("INIT", round(time.monotonic() - started, 2), "SUM", total.tolist(), flush=True)
''')


def test_strangers_on_a_data_port_are_refused_and_cannot_stall_start_up() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        env = child_env({"HOROVOD_FAILURE_DETECTION_SECONDS": "1", "HOROVOD_CPU_OPERATIONS": "tcp"})
        proc = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable,
                                 str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        strangers: list[socket.socket] = []
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("[0]<stdout>:PID"), line
            pid = int(line.split()[-1])
            deadline = time.monotonic() + 10
            ports: list[tuple[str, int]] = []
            while not ports and time.monotonic() < deadline:  # rank 0's data-plane listener
                ports = listening_addresses(pid)
            assert ports, "rank 0 never listened"
            address = ports[0]
            assert address[0] == "127.0.0.1"
            for payload in (b"", b"", b"GET / HTTP/1.1\r\n\r\n", wire.MAGIC + os.urandom(wire.NONCE_BYTES)):
                stranger = socket.create_connection(address, timeout=5)
                stranger.sendall(payload)  # nothing at all, another protocol, or no proof of the key
                strangers.append(stranger)
            out, err = proc.communicate(timeout=60)
        finally:
            for stranger in strangers:
                stranger.close()
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    assert out.count("SUM [0.0, 2.0, 4.0, 6.0]") == 2
    assert err.count("refused a data connection") == 4
    assert err.count("it sent nothing for 1 s") == 3  # the silent two, and the one owing a proof
    assert err.count("peer does not speak the khorovod protocol") == 1
    init = float(next(line for line in out.splitlines() if line.startswith("[0]") and "INIT" in line).split()[1])
    # Rank 1 came after 3 s; the two silent strangers and the one without a proof held rank 0 for
    # about 1 s each (the setting), the other was refused at once. Without the bound: 30 s each.
    assert init < 3 + 3 + 4, init
