"""Sharded optimizer state in elastic jobs: a rank SIGKILLed mid-training, a host added by
discovery. The job goes on without a restart or a checkpoint, and its final parameters equal
those of one uninterrupted process (unsharded Adam) taking the same committed steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.elastic.test_elastic_jobs import REPO, discovery, shm_segments  # noqa: E402

TRAIN = str(Path(__file__).with_name("train_sharded.py"))


def run_job(tmp_path: Path, flags: list[str], epochs: int, batches: int, **env: str) -> dict:
    child = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                 **env)
    child.pop("_HOROVOD_SECRET_KEY", None)
    before = shm_segments()
    done = subprocess.run([sys.executable, "-m", "horovod.runner.launch", *flags,
                           sys.executable, TRAIN, str(tmp_path), str(epochs), str(batches)],
                          capture_output=True, text=True, timeout=180, env=child, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert shm_segments() - before == set(), "the job left shared memory behind"
    return json.loads((tmp_path / "result.json").read_text())


def replay(steps: list) -> list[list[float]]:
    """One process, plain Adam, the committed steps from the same start: each step's gradient is
    the average over the ranks of each rank's mean loss, as the job's reduction makes it."""
    from tests.elastic.train_sharded import LR, loss_of, make_model

    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for parts in steps:
        optimizer.zero_grad()
        (sum(loss_of(model, part) for part in parts) / len(parts)).backward()
        optimizer.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def assert_equals_replay(result: dict) -> None:
    expected = replay(result["steps"])
    for got, want in zip(result["parameters"], expected):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)


# (start hosts, horovodrun flags, epochs, batches, environment, sizes at the start and the end)
CHANGES = {
    # rank 2 SIGKILLed: its block's copy is on rank 1
    "rank-killed": ("localhost:2,127.0.0.1:1", ["-np", "3", "--min-np", "2"], 2, 5, {"ELASTIC_KILL": "0:3:2"}, (3, 2)),
    # a third rank joins and gets its block from the two others
    "host-added": ("localhost:2", ["-np", "2", "--min-np", "2"], 3, 4,
                   {"ELASTIC_HOSTS": "1=localhost:2,127.0.0.1:1"}, (2, 3)),
    # only removals: the survivors skip the sync, so the optimizer reshards at its next step
    "host-removed": ("localhost:2,127.0.0.1:1", ["-np", "3", "--min-np", "2"], 3, 4,
                     {"ELASTIC_HOSTS": "1=localhost:2"}, (3, 2)),
}


@pytest.mark.parametrize("change", CHANGES)
def test_blocks_follow_membership_changes_and_training_equals_an_uninterrupted_run(tmp_path, change):
    hosts, flags, epochs, batches, env, (first, last) = CHANGES[change]
    script = discovery(tmp_path, hosts)
    result = run_job(tmp_path, [*flags, "--host-discovery-script", script], epochs, batches, **env)
    assert result["sizes"][0] == first and result["sizes"][-1] == last
    assert_equals_replay(result)
