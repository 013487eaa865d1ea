"""The elastic examples run as docs/elastic.md shows them, from the repository root: the torch one
under a host discovery script, the Keras one on fixed hosts with --min-np. Each must finish every
epoch, with only rank 0 reporting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": ""}


def horovodrun(flags: list[str], script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **QUIET_TF,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("_HOROVOD_SECRET_KEY", None)
    done = subprocess.run([sys.executable, "-m", "horovod.runner.launch", *flags, sys.executable, script, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=240, env=env, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_torch_example_under_the_discovery_script():
    pytest.importorskip("torch")
    done = horovodrun(["-np", "2", "--min-np", "1", "--max-np", "4",
                       "--host-discovery-script", "./examples/elastic/discover_hosts.sh"],
                      "examples/elastic/pytorch_elastic.py", "--epochs", "2")
    # discover_hosts.sh offers localhost:2 (no hosts.txt in the repository): two workers throughout.
    lines = re.findall(r"epoch (\d+): loss [\d.]+ on (\d+) workers", done.stdout)
    assert lines == [("0", "2"), ("1", "2")], done.stdout[-3000:]


def test_keras_example_on_fixed_hosts():
    pytest.importorskip("tensorflow")
    done = horovodrun(["-np", "3", "--min-np", "2", "-H", "localhost:2,127.0.0.1:1"],
                      "examples/elastic/keras_elastic.py", "--epochs", "2")
    # Two hosts: horovodrun prefixes each line with its rank. Keras prints (verbose=2) on rank 0 only.
    epochs = re.findall(r"^(\[\d+\]<stdout>:)?Epoch (\d+)/2", done.stdout, flags=re.M)
    assert epochs == [("[0]<stdout>:", "1"), ("[0]<stdout>:", "2")], done.stdout[-3000:]
