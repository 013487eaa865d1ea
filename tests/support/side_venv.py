"""Environments of their own for what cannot share the main one's versions (MXNet's numpy<1.24, the
S3 test server's python-dateutil<3): made by a scripts/setup-*-venv.sh script, which scripts/test.sh
runs first and a test reuses (or makes, the first time here)."""

from __future__ import annotations

import os
import subprocess

from engines import engine_unavailable
from multirank import REPO


def side_venv_python(script: str, override: str, what: str) -> str:
    """The interpreter of the environment `scripts/<script>` makes, or the one the variable
    `override` names; `engine_unavailable` saying that `what` could not be installed."""
    given = os.environ.get(override)
    if given:
        return given
    proc = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True, cwd=REPO,
                          timeout=280)
    if proc.returncode != 0:
        engine_unavailable(f"{what} could not be installed here: {proc.stderr.strip()[-500:]}")
    return str(REPO / proc.stdout.strip().splitlines()[-1])
