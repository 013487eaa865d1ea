"""Run one of the Horovod-style example scripts through a launcher command (2 ranks in the tests), shortened,
and read rank 0's final test accuracy: the same check under horovodrun, mpirun and srun."""

from __future__ import annotations

import re
import sys

import pytest

from mpirunner import REPO, run_command

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": ""}
# name: (script, arguments, what rank 0 prints last (group 1: the test accuracy), lowest accuracy in [0, 1])
EXAMPLES = {
    "pytorch": ("examples/pytorch/pytorch_digits.py", ["--epochs", "3"], r"final test accuracy: ([\d.]+)%", 0.8),
    "tensorflow": ("examples/tensorflow2/tensorflow2_digits.py", ["--epochs", "2"],
                   r"epoch 2/2: loss [\d.]+, test accuracy ([\d.]+)", 0.5),
}


def run_example(head: list[str], example: str, env: dict[str, str] | None = None, timeout: float = 240) -> None:
    """Run `example` through the launcher command `head` (with its rank count); asserts it exits
    cleanly, that only rank 0 reports, and that the model learnt."""
    pytest.importorskip("torch" if example == "pytorch" else "tensorflow")
    pytest.importorskip("sklearn")
    script, args, final, lowest = EXAMPLES[example]
    result = run_command([*head, sys.executable, str(REPO / script), *args],
                         env={**TF_ENV, **(env or {})}, timeout=timeout, cwd=str(REPO))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = re.findall(final, result.stdout)
    assert len(found) == 1, result.stdout[-3000:]  # only rank 0 prints
    accuracy = float(found[0]) / (100 if "%" in final else 1)
    assert accuracy > lowest, result.stdout[-3000:]
