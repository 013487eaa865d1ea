"""examples/ray/ray_digits.py as docs/ray.md runs it (shortened), on the test cluster, in each of its
three modes: the executor, the elastic executor, and a Ray Tune grid search of two trials."""

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
@pytest.mark.parametrize("mode", ["executor", "elastic", "tune"])
def test_ray_digits(ray_cluster, mode, tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "examples" / "ray" / "ray_digits.py"), "--mode", mode,
                           "--address", ray_cluster.address, "--epochs", "3", "--storage-path", str(tmp_path)],
                          capture_output=True, text=True, timeout=280, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    if mode == "tune":  # one line per trial of the grid, then the best learning rate
        trials = re.findall(r"lr ([\d.]+): test accuracy ([\d.]+)", done.stdout)
        assert sorted(lr for lr, _ in trials) == ["0.005", "0.05"], done.stdout
        assert re.search(r"best lr: 0\.0", done.stdout), done.stdout
    else:  # rank 0's per-epoch line
        assert re.search(r"epoch 3: test accuracy 0\.[89]\d+ on 2 workers", done.stdout), done.stdout
    accuracy = float(re.search(r"final test accuracy: (\S+)", done.stdout).group(1))
    assert accuracy > 0.85, done.stdout
