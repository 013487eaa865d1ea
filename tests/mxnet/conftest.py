"""The MXNet environment (scripts/setup-mxnet-venv.sh): its interpreter runs the ranks.

MXNet 1.9.1 needs numpy<1.24, so it cannot live in the environment running pytest. The script
reuses the environment scripts/test.sh made (or makes it); HOROVOD_TEST_MXNET_PYTHON names
another interpreter that has mxnet, cloudpickle and pyyaml."""

import pytest

from side_venv import side_venv_python


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    return side_venv_python("setup-mxnet-venv.sh", "HOROVOD_TEST_MXNET_PYTHON", "mxnet 1.9.1")
