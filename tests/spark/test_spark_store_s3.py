"""The stores on S3: `Store.create("s3://...")` against a real S3-compatible server (moto's server
mode) that the fixture starts on loopback.

moto and s3fs both need python-dateutil<3 (through botocore), older than the main environment's,
so they live in an environment of their own (scripts/setup-s3-venv.sh, reused from scripts/test.sh
or made here; HOROVOD_TEST_S3_PYTHON names another interpreter with moto[server], s3fs and
cloudpickle). The server runs from it, and so do the store's checks (s3_store_checks.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from engines import engine_unavailable
from side_venv import side_venv_python

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def s3_python() -> str:
    return side_venv_python("setup-s3-venv.sh", "HOROVOD_TEST_S3_PYTHON", "moto[server] and s3fs")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint(s3_python: str) -> Iterator[str]:
    """moto's S3 server on 127.0.0.1, stopped at the module's end."""
    port = free_port()
    server = subprocess.Popen([str(Path(s3_python).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60  # starting Flask and moto's imports: seconds under load
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    engine_unavailable(f"moto_server did not start: {server.stderr.read().decode()[-500:]}")
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(30)


def test_an_s3_store_writes_reads_and_finds_checkpoints(s3_python, s3_endpoint):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(name, None)
    done = subprocess.run([s3_python, str(Path(__file__).parent / "s3_store_checks.py"), s3_endpoint], env=env,
                          capture_output=True, text=True, timeout=200)
    assert done.returncode == 0 and "S3 STORE OK" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
