"""The MXNet environment (scripts/setup-mxnet-venv.sh): its interpreter runs the ranks.

MXNet 1.9.1 needs numpy<1.24, so it cannot live in the environment running pytest. The script
reuses the environment scripts/test.sh made (or makes it); HOROVOD_TEST_MXNET_PYTHON names
another interpreter that has mxnet, cloudpickle and pyyaml."""

import os
import subprocess

import pytest

from engines import engine_unavailable
from multirank import REPO


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    given = os.environ.get("HOROVOD_TEST_MXNET_PYTHON")
    if given:
        return given
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup-mxnet-venv.sh")], capture_output=True, text=True,
                          cwd=REPO, timeout=280)
    if proc.returncode != 0:
        engine_unavailable(f"mxnet 1.9.1 could not be installed here: {proc.stderr.strip()[-500:]}")
    return str(REPO / proc.stdout.strip().splitlines()[-1])
