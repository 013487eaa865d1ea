"""Autotune on real ranks, switched on with horovodrun's --autotune flags: the knobs change
during the job, identically on every rank at the same moment, results stay exact, rank 0 writes
the CSV log, and a knob the user set is left alone."""

import csv

import pytest

from multirank import hvdrun

pytest.importorskip("sklearn")

JOB = r'''
import numpy as np
import horovod.numpy as hvd
from horovod.common import basics

hvd.init()
r, n = hvd.rank(), hvd.size()
cycle = basics.runtime().engine.cycle
seen, wrong = [], 0
step = 0

def tuning():
    """Whether autotune still runs, agreed by all ranks: each reads it between its own steps, and
    one may read it just before its engine thread applies the final decision, another just after."""
    return hvd.allreduce(np.array([float(cycle.autotuner is not None)]), op=hvd.Max, name="tuning")[0] > 0

while tuning() and step < 400:
    handles = [hvd.allreduce_async(np.full(1000 * (i + 1), r + i, np.float32), name=f"g{i}", op=hvd.Sum)
               for i in range(4)]
    for i, h in enumerate(handles):
        wrong += int(not np.array_equal(hvd.synchronize(h), np.full(1000 * (i + 1), sum(range(n)) + n * i)))
    t = cycle.tunables
    seen.append([t.fusion_threshold, t.cycle_time_ms, t.cache_enabled])
    step += 1
report(seen=seen, wrong=wrong, steps=step, done=cycle.autotuner is None)
'''

FLAGS = ["--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "2",
         "--autotune-bayes-opt-max-samples", "5", "--cycle-time-ms", "2"]


def test_autotune_tunes_in_lockstep_and_logs(tmp_path):
    log = tmp_path / "autotune.csv"
    result = hvdrun(JOB, np=2, args=["--autotune", "--autotune-log-file", str(log), *FLAGS], timeout=240).check()
    ranks = result.ranks
    assert ranks[0]["done"] and ranks[1]["done"], "autotune did not finish"
    assert ranks[0]["wrong"] == ranks[1]["wrong"] == 0
    # Every rank went through the same knobs in the same order (a step may read them just before
    # or after its engine thread applied a change, so compare the sequences of changes).
    def changes(seen):
        return [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]]

    assert changes(ranks[0]["seen"]) == changes(ranks[1]["seen"])
    thresholds = {s[0] for s in ranks[0]["seen"]}
    assert len(thresholds) >= 4  # the fusion threshold was searched
    assert {s[1] for s in ranks[0]["seen"]} == {2.0}  # --cycle-time-ms pinned it
    rows = list(csv.reader(log.open()))
    assert rows[0][:6] == ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce", "cache_enabled",
                           "cycle_time_ms", "tensor_fusion_threshold"]
    assert len(rows) == 1 + 5 + 2 + 1  # 5 joint configurations, cache off/on, the chosen one
    assert all(row[4] == "2" for row in rows[1:])
    final = ranks[0]["seen"][-1]
    # the threshold in MB, as Horovod writes it
    assert [float(rows[-1][5]), rows[-1][3] == "1"] == [pytest.approx(final[0] / 2**20, rel=1e-5), final[2]]


def test_without_autotune_the_knobs_stay_put():
    result = hvdrun(JOB.replace("tuning() and step < 400", "step < 5"), np=2,
                    env={"HOROVOD_FUSION_THRESHOLD": "1048576"}).check()
    assert {tuple(s) for s in result.ranks[0]["seen"]} == {(1048576, 1.0, True)}


CACHE_BACK_ON = r'''
import numpy as np
import horovod.numpy as hvd
from horovod.common import basics

hvd.init()
r = hvd.rank()
cycle = basics.runtime().engine.cycle
x = np.ones(4, np.float32)
cache_on, right = [], True
for step in range(14):
    # Rank 1 submits "x" before the two "y", rank 0 after them. A sample closes when some tensor
    # was reduced twice: always on the second "y", so every knob changes while rank 1's "x" is
    # negotiated and rank 0's is not submitted yet.
    if r == 1:
        handle = hvd.allreduce_async(x, name="x", op=hvd.Sum)
    for _ in range(2):
        right &= hvd.allreduce(x, name="y", op=hvd.Sum).tolist() == [2.0] * 4
    if r == 0:
        handle = hvd.allreduce_async(x, name="x", op=hvd.Sum)
    right &= hvd.synchronize(handle).tolist() == [2.0] * 4
    cache_on.append(cycle.tunables.cache_enabled)
report(cache_on=cache_on, right=right, done=cycle.autotuner is None)
'''


def test_cache_switched_back_on_mid_negotiation_does_not_hang():
    # Only the cache is tuned (the other knobs are pinned): on during the warm-up sample, off for
    # five samples, on for five. With the stall check off nothing would end a hang but the timeout.
    flags = ["--autotune", "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", "2",
             "--fusion-threshold-mb", "1", "--cycle-time-ms", "2"]
    result = hvdrun(CACHE_BACK_ON, np=2, args=flags, env={"HOROVOD_STALL_CHECK_DISABLE": "1"}, timeout=120).check()
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["right"] and got["done"]
        switched_on = [i for i in range(1, 14) if got["cache_on"][i] and not got["cache_on"][i - 1]]
        assert switched_on, got["cache_on"]  # the cache did go from off back to on
