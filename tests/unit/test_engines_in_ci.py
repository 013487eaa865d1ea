"""An integration test whose engine cannot start skips on a developer's machine and fails in CI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from multirank import REPO, child_env

PROBE = '''
from engines import engine_unavailable

def test_needs_an_engine():
    engine_unavailable("no Java runtime (Spark needs one)")
'''


@pytest.mark.parametrize("ci, outcome", [("", "1 skipped"), ("true", "1 failed")])
def test_an_engine_that_cannot_start_skips_here_and_fails_in_ci(tmp_path, ci, outcome):
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = child_env({"CI": ci})
    env["PYTHONPATH"] += f":{REPO / 'tests' / 'support'}"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "test_probe.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert outcome in proc.stdout, proc.stdout
    assert "no Java runtime (Spark needs one)" in proc.stdout
    if ci:
        assert "CI (CI=true) must have this engine" in proc.stdout
