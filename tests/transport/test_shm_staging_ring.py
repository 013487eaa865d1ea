"""Large two-rank allreduces staged through the ring in the fusion region (transport/shm/staging.py).

Each rank chooses for its own pieces; the peer follows what the first round says. Every mix of
choices must give exact results, whatever the op, dtype and size (a ring reused within one op,
an op that ends mid-ring, the fusion region reused by a fused op right after a ring op).
"""

import pytest

from multirank import hvdrun

RING_JOB = r'''
import os
os.environ["HOROVOD_SHM_STAGING"] = os.environ["STAGING_RANK" + os.environ["HOROVOD_RANK"]]
import numpy as np
import horovod.numpy as hvd
from horovod.common import basics

hvd.init()
r, n = hvd.rank(), hvd.size()
tr = basics.runtime().transport
problems, rings = [], []

def check(label, got, want):
    if got.dtype != want.dtype or not np.array_equal(got, want):
        bad = np.flatnonzero(got != want)
        problems.append(f"{label}: {bad.size} elements differ, first at {bad[:3]}: {got[bad[:3]]} vs {want[bad[:3]]}")

# 16 MiB + 3 elements: the last piece is short; 40 MiB: more pieces than the ring holds, so the
# ring is reused within the op; repeated, so that ops start mid-ring.
cases = [(np.float32, (4 << 20) + 3, hvd.Sum), (np.float64, 5 << 20, hvd.Max), (np.int32, (2 << 20) + 1, hvd.Sum),
         (np.float64, (3 << 20) + 7, hvd.Average)]
for repeat in range(3):
    for dtype, size, op in cases:
        base = (np.arange(size) % 1000).astype(dtype)
        mine = base * 2 * (r + 1)
        if op == hvd.Max:
            want = base * 2 * n
        elif op == hvd.Average:
            want = base * (n + 1)
        else:
            want = base * n * (n + 1)
        got = hvd.allreduce(mine, op=op, name=f"big{np.dtype(dtype).name}{size}")
        check(f"{np.dtype(dtype).name} {size} op {op} repeat {repeat}", got, want)
        rings.append(int(tr.host.mine.slot_desc[1]))
    # The fusion region, which the ring shares, filled by a fused op right after.
    shapes = [(1000,), (300_001,), (17,)]
    fused = hvd.grouped_allreduce([np.full(s, r + 1, np.int64) for s in shapes], op=hvd.Sum, name=f"fused{repeat}")
    for s, got in zip(shapes, fused):
        check(f"fused {s} repeat {repeat}", got, np.full(s, n * (n + 1) // 2, np.int64))

report(problems=problems, rings=rings, choice=tr.shm.staging.mode)
'''


@pytest.mark.parametrize("rank0,rank1", [("ring", "ring"), ("ring", "slots"), ("slots", "ring")])
def test_every_mix_of_staging_choices_is_exact(rank0, rank1):
    result = hvdrun(RING_JOB, np=2, env={"STAGING_RANK0": rank0, "STAGING_RANK1": rank1}, timeout=180).check()
    for rank, values in result.every_rank(2):
        assert values["problems"] == [], f"rank {rank}: {values['problems']}"
        chose = (rank0, rank1)[rank]
        assert values["choice"] == chose
        # What each op published for its peer: the ring's depth (32 MiB of 512 KiB pieces), or 0.
        assert set(values["rings"]) == ({64} if chose == "ring" else {0})


def test_an_unknown_staging_choice_is_refused_by_name():
    result = hvdrun("import horovod.numpy as hvd\nhvd.init()\n", np=1, env={"HOROVOD_SHM_STAGING": "deep"}, timeout=60)
    assert result.returncode != 0
    assert "HOROVOD_SHM_STAGING='deep' is not one of auto, slots, ring" in result.stdout + result.stderr
