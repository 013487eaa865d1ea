"""Elastic jobs through the real horovodrun: workers killed (SIGKILL) or failing by exception,
hosts added and removed by a discovery script, fixed hosts with --min-np, a blacklisted host
coming back after its cooldown, the reset limit and the elastic timeout.

Hosts are `localhost` and `127.0.0.1`: two names for this machine, so the driver sees two hosts.
Every run trains `train_torch.py` and checks what rank 0 committed: every sample of every epoch
exactly once (the sampler's promise) with the memberships the driver announced.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(Path(__file__).with_name("train_torch.py"))


def shm_segments() -> set[str]:
    """Our shared-memory segments (`khvd-<pid>-...`); other programs' are none of our business."""
    return {name for name in os.listdir("/dev/shm") if name.startswith("khvd-")} if os.path.isdir("/dev/shm") else set()


def horovodrun(tmp_path: Path, flags: list[str], epochs: int = 2, batches: int = 5, timeout: float = 90,
               **env: str) -> subprocess.CompletedProcess[str]:
    child = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                 **env)
    child.pop("_HOROVOD_SECRET_KEY", None)
    before = shm_segments()
    done = subprocess.run([sys.executable, "-m", "horovod.runner.launch", *flags,
                           sys.executable, TRAIN, str(tmp_path), str(epochs), str(batches)],
                          capture_output=True, text=True, timeout=timeout, env=child, start_new_session=True)
    assert shm_segments() - before == set(), "the job left shared memory behind"
    return done


def discovery(tmp_path: Path, hosts: str) -> str:
    """A discovery script printing OUT_DIR/hosts, which starts as `hosts` (the training may rewrite it).
    When a worker has left its pid in OUT_DIR/victim, the script SIGKILLs it first, then takes a
    moment before answering: the worker dies while the driver's discovery runs."""
    (tmp_path / "hosts").write_text(hosts.replace(",", "\n") + "\n")
    script = tmp_path / "discover.sh"
    victim = tmp_path / "victim"
    script.write_text(f"#!/bin/sh\nif [ -f {victim} ]; then kill -9 $(cat {victim}); rm -f {victim}; sleep 0.3; fi\n"
                      f"cat {tmp_path / 'hosts'}\n")
    script.chmod(0o755)
    return str(script)


def replay(steps: list) -> tuple[float, float]:
    """The weight and bias a run without failures reaches through the same committed steps (each:
    every rank's samples) from the same start: what committed state must amount to."""
    import torch

    from tests.elastic.train_torch import LR, loss_of, make_model

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _, parts in steps:
        optimizer.zero_grad()
        (sum(loss_of(model, part) for part in parts) / len(parts)).backward()  # the average over ranks
        optimizer.step()
    return model.weight.item(), model.bias.item()


def committed(tmp_path: Path, epochs: int) -> dict:
    """Rank 0's record, after checking that every sample of every epoch was committed exactly once
    (but for the padding of an epoch's last step: fewer than `size` repeats, as DistributedSampler
    pads), and that the final model is the one the committed steps produce without failures."""
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["weight"], result["bias"]) == pytest.approx(replay(result["steps"]), rel=1e-4, abs=1e-6)
    counts = collections.Counter((epoch, i) for epoch, parts in result["steps"] for part in parts for i in part)
    expected = {(epoch, i) for epoch in range(epochs) for i in range(result["dataset"])}
    assert set(counts) == expected
    for epoch in range(epochs):
        repeats = sum(n - 1 for (e, _), n in counts.items() if e == epoch)
        assert repeats < max(result["sizes"]), (epoch, repeats)
    # After every re-init, HOROVOD_RANK and the other slot variables follow the new round.
    assert result["env_mismatches"] == []
    return result


def test_a_worker_killed_with_sigkill_is_dropped_with_its_host_and_training_goes_on(tmp_path):
    script = discovery(tmp_path, "localhost:2,127.0.0.1:1")
    done = horovodrun(tmp_path, ["-np", "3", "--min-np", "2", "--host-discovery-script", script],
                      ELASTIC_KILL="0:3:2")
    assert done.returncode == 0, done.stderr
    assert "worker 127.0.0.1:0 (rank 2 of round 1) on host 127.0.0.1 was killed by signal SIGKILL; " \
           "host 127.0.0.1 blacklisted for good" in done.stderr
    assert "round 2: 2 workers (rank=host:slot: 0=localhost:0, 1=localhost:1)" in done.stderr
    sizes = committed(tmp_path, 2)["sizes"]
    assert sizes[:3] == [3, 3, 3] and set(sizes[3:]) == {2}


@pytest.mark.parametrize("kills, dead, final", [
    ("0:2:1:commit", ["127.0.0.1:0 (rank 1 of round 1)"], 2),  # in state.commit(), between snapshot and host check
    ("0:1:2,0:1:1:reset", ["127.0.0.2:0 (rank 2 of round 1)", "127.0.0.1:0 (rank 1 of round 2)"], 1),  # in re-init
    ("0:1:1:discovery", ["127.0.0.1:0 (rank 1 of round 1)"], 2),  # by the discovery script, while it runs
], ids=["during-commit", "during-re-init", "during-discovery"])
def test_a_worker_killed_during_commit_re_init_or_discovery_never_hangs_the_job(tmp_path, kills, dead, final):
    script = discovery(tmp_path, "localhost:1,127.0.0.1:1,127.0.0.2:1")
    # Steps slow enough that the driver's discovery (about once a second) runs while training goes on.
    done = horovodrun(tmp_path, ["-np", "3", "--min-np", "1", "--host-discovery-script", script], ELASTIC_KILL=kills,
                      ELASTIC_STEP_SECONDS="0.2")
    assert done.returncode == 0, done.stderr
    for worker in dead:
        assert f"worker {worker}" in done.stderr and "killed by signal SIGKILL" in done.stderr, done.stderr
    sizes = committed(tmp_path, 2)["sizes"]
    assert sizes[0] == 3 and sizes[-1] == final


def test_a_worker_failing_by_exception_on_fixed_hosts_with_min_np(tmp_path):
    done = horovodrun(tmp_path, ["-np", "3", "--min-np", "2", "-H", "localhost:2,127.0.0.1:1"],
                      ELASTIC_KILL="0:2:2:raise")
    assert done.returncode == 0, done.stderr
    assert "ValueError: rank 2 fails on purpose at epoch 0 batch 2" in done.stderr
    assert "on host 127.0.0.1 exited with exit code 1" in done.stderr
    sizes = committed(tmp_path, 2)["sizes"]
    assert sizes[:2] == [3, 3] and set(sizes[2:]) == {2}


def test_hosts_added_and_removed_by_the_discovery_script(tmp_path):
    script = discovery(tmp_path, "localhost:2")
    done = horovodrun(tmp_path, ["-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", script],
                      epochs=3, ELASTIC_HOSTS="1=localhost:2,127.0.0.1:1;2=localhost:2", ELASTIC_STEP_SECONDS="0.25")
    assert done.returncode == 0, done.stderr
    assert "hosts changed (added)" in done.stderr and "hosts changed (removed)" in done.stderr
    assert "3 workers (rank=host:slot: 0=localhost:0, 1=localhost:1, 2=127.0.0.1:0)" in done.stderr
    sizes = committed(tmp_path, 3)["sizes"]
    assert sizes[0] == 2 and 3 in sizes and sizes[-1] == 2


def test_a_blacklisted_host_comes_back_after_its_cooldown(tmp_path):
    script = discovery(tmp_path, "localhost:1,127.0.0.1:1")
    done = horovodrun(tmp_path, ["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "1", "2",
                                 "--host-discovery-script", script],
                      epochs=3, ELASTIC_KILL="0:1:1", ELASTIC_STEP_SECONDS="0.25")
    assert done.returncode == 0, done.stderr
    # The first cooldown is 1-2 s (randomised): printed as 1.0 to 2.0
    assert re.search(r"host 127\.0\.0\.1 blacklisted for (1\.\d|2\.0) s", done.stderr), done.stderr
    sizes = committed(tmp_path, 3)["sizes"]
    first_one = sizes.index(1)
    assert sizes[0] == 2 and 2 in sizes[first_one:], sizes


def test_the_reset_limit_stops_the_job_naming_it(tmp_path):
    script = discovery(tmp_path, "localhost:2,127.0.0.1:1")
    done = horovodrun(tmp_path, ["-np", "3", "--min-np", "2", "--reset-limit", "0", "--host-discovery-script", script],
                      ELASTIC_KILL="0:1:2")
    assert done.returncode == 1
    assert "number of resets during elastic job exceeded limit: 0" in done.stderr


def test_the_elastic_timeout_fails_the_job_below_min_np(tmp_path):
    script = discovery(tmp_path, "localhost:1,127.0.0.1:1")
    done = horovodrun(tmp_path, ["-np", "2", "--min-np", "2", "--elastic-timeout", "2", "--host-discovery-script",
                                 script], ELASTIC_KILL="0:1:1")
    assert done.returncode == 1
    assert "timed out after 2 s (--elastic-timeout) waiting for --min-np 2 slots; usable hosts: localhost:1" \
        in done.stderr


def _elastic_fn(out: str) -> tuple[int, int]:
    import signal

    import torch

    import horovod.torch as hvd

    hvd.init()
    state = hvd.elastic.ObjectState(step=0)

    @hvd.elastic.run
    def train(state):
        while state.step < 6:
            hvd.allreduce(torch.tensor(1.0), name="x")
            marker = os.path.join(out, "killed")
            if state.step == 2 and hvd.rank() == 2 and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            state.step += 1
            state.commit()
        return hvd.size()

    size = train(state)
    return hvd.rank(), size


def test_horovod_run_elastic_returns_the_first_min_np_results_of_the_final_round(tmp_path, monkeypatch):
    import horovod

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    script = discovery(tmp_path, "localhost:2,127.0.0.1:1")
    results = horovod.run(_elastic_fn, args=(str(tmp_path),), num_proc=3, min_num_proc=2,
                          host_discovery_script=script)
    assert results == [(0, 2), (1, 2)]


def test_keras_fit_survives_a_sigkill_and_finishes_every_epoch(tmp_path):
    pytest.importorskip("tensorflow", reason="the Keras state is tested on the TensorFlow backend")
    done = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", "3", "--min-np", "2",
                           "-H", "localhost:2,127.0.0.1:1", sys.executable,
                           str(Path(__file__).with_name("train_keras.py")), str(tmp_path), "3"],
                          capture_output=True, text=True, timeout=180, start_new_session=True,
                          env=dict(os.environ, ELASTIC_KILL="1:3:2", PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "round 2: 2 workers" in done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["epoch"] == 3
    # Epoch 0 and 3 or 4 batches of epoch 1 with 3 workers (the 4th is committed when the survivors
    # got that far before the failure was seen); then epoch 1 again from its start, and epoch 2, with 2.
    threes = result["sizes"].count(3)
    assert threes in (11, 12) and result["sizes"] == [3] * threes + [2] * 16
    assert abs(result["weights"][0]) > 0.1  # it trained
