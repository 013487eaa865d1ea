"""Each local rank runs on its own share of the cores (where nobody placed the processes), on
real ranks: the shares are disjoint and cover the machine, threads started before init follow,
and the original affinity comes back at shutdown."""

from __future__ import annotations

import os

import pytest

from multirank import hvdrun

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")

REPORT = r'''
import os, threading
import numpy as np
import horovod.numpy as hvd
{before}
started = threading.Event()
worker = threading.Thread(target=started.wait, daemon=True)
worker.start()
hvd.init()
bound = sorted(os.sched_getaffinity(0))
thread = sorted(os.sched_getaffinity(worker.native_id))
total = hvd.allreduce(np.ones(4), op=hvd.Sum)
hvd.shutdown()
started.set()
report(bound=bound, thread=thread, after=sorted(os.sched_getaffinity(0)), total=total.tolist())
'''


def test_local_ranks_get_disjoint_shares_and_get_everything_back_at_shutdown() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) != os.cpu_count() or len(cores) < 2:
        pytest.skip("this test process is already placed on some of the cores, or there is one core")
    result = hvdrun(REPORT.format(before="")).check()
    shares = [result.ranks[r]["bound"] for r in (0, 1)]
    assert all(shares) and not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == cores
    for r in (0, 1):
        values = result.ranks[r]
        assert values["thread"] == values["bound"]  # a thread that existed before init was moved too
        assert values["after"] == cores and values["total"] == [2.0] * 4


@pytest.mark.parametrize("before, env", [
    ("", {"HOROVOD_CPU_BINDING": "0"}),  # turned off
    ("os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})", {}),  # placed by the user (taskset, mpirun)
])
def test_processes_placed_already_or_with_binding_off_stay_where_they_are(before: str, env: dict[str, str]) -> None:
    result = hvdrun(REPORT.format(before=before), env=env).check()
    for r in (0, 1):
        values = result.ranks[r]
        assert values["bound"] == values["after"] == values["thread"]
        assert values["total"] == [2.0] * 4
        if not before:
            assert values["bound"] == sorted(os.sched_getaffinity(0))
