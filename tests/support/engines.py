"""What a test does when the real engine it runs against cannot be started here.

On a developer's machine it skips, saying why. In CI (`CI=true`, which .ci/run exports), where
every engine the suite uses is installed, it fails instead: an integration test must never pass
there having checked nothing. Every fixture that starts an engine says so through this one
function: Slurm (tests/slurm/conftest.py), Spark and its Java (tests/spark/conftest.py), network
namespaces (tests/reliability/test_network_faults.py) and MXNet's environment
(tests/mxnet/conftest.py).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def engine_unavailable(reason: str) -> NoReturn:
    """Skip (here) or fail (in CI) the current test: its engine could not be started, for `reason`."""
    if in_ci():
        pytest.fail(f"{reason}; CI (CI=true) must have this engine, so the test fails instead of skipping",
                    pytrace=False)
    pytest.skip(reason)
