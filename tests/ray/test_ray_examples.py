"""examples/ray/ray_digits.py as docs/ray.md runs it (shortened), on the test cluster: the executor
and elastic modes (the Tune mode is the grid search of test_ray_tune.py with PyTorch inside, and
would add another minute)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")
pytest.importorskip("sklearn", reason="the example reads scikit-learn's digits (the [examples] extra)")

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["executor", "elastic"])
def test_ray_digits(ray_cluster, mode, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "examples" / "ray" / "ray_digits.py"), "--mode", mode,
                           "--address", ray_cluster.address, "--epochs", "3", "--storage-path", str(tmp_path)],
                          capture_output=True, text=True, timeout=280, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"epoch 3: test accuracy 0\.[89]\d+ on 2 workers", done.stdout), done.stdout
    accuracy = float(re.search(r"final test accuracy: (\S+)", done.stdout).group(1))
    assert accuracy > 0.85, done.stdout
