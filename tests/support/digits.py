"""The digits examples (`examples/*/*_digits.py`) run the same way for every framework: two
ranks through horovodrun, a loss that drops, an accuracy above a floor, one model on all ranks."""

from __future__ import annotations

import re
import subprocess
import sys

from multirank import REPO, child_env


def check_digits_example(script: str, *args: str, python: str = sys.executable,
                         min_accuracy: float = 85.0) -> str:
    """Run `examples/<script>` on 2 ranks with `python`; assert that it trained; return stdout."""
    command = [sys.executable, "-m", "horovod.runner.launch", "-np", "2", python, str(REPO / "examples" / script),
               *args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=180, env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[1]<stdout>" not in proc.stdout  # only rank 0 prints
    losses = [float(v) for v in re.findall(r"\[0\]<stdout>:epoch +\d+  loss ([\d.]+)", proc.stdout)]
    assert len(losses) == 2 and losses[-1] < losses[0], proc.stdout
    accuracy = float(re.search(r"final test accuracy ([\d.]+)%", proc.stdout).group(1))
    assert accuracy > min_accuracy and "all ranks hold the same model: True" in proc.stdout, proc.stdout
    return proc.stdout
