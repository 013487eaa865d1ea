"""Each local rank runs on its own share of the cores (where nobody placed the processes), on
real ranks: the shares are disjoint and cover the machine, threads started before init follow,
and the original affinity comes back at shutdown."""

from __future__ import annotations

import os

import pytest

from multirank import hvdrun

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")

def whole_machine() -> list[int]:
    """Every core, where this test process may use all of them (else the test is skipped)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) != os.cpu_count() or len(cores) < 2:
        pytest.skip("this test process is already placed on some of the cores, or there is one core")
    return cores


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
    cores = whole_machine()
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


SHARED_CORE = r'''
import os, subprocess, sys, time
import numpy as np
import horovod.numpy as hvd
hvd.init()
bound = sorted(os.sched_getaffinity(0))
# Another job's busy process, put by the kernel on this rank's core.
hog = subprocess.Popen([sys.executable, "-c", "import os; os.sched_setaffinity(0, %r); exec('while True: pass')" % (bound,)]) if {hog} else None
try:
    end, ok, going = time.monotonic() + 3.0, True, True
    while going:  # the same number of ops on both ranks: both go on while both want to
        if "{op}" == "allreduce":  # small: its data goes with the negotiation, no transport call
            ok &= hvd.allreduce(np.full(1024, hvd.rank() + 1.0), op=hvd.Sum, name="x").tolist() == [3.0] * 1024
        else:
            ok &= hvd.broadcast(np.full(1024, hvd.rank() + 1.0), root_rank=1, name="x").tolist() == [2.0] * 1024
        going = bool(hvd.allreduce(np.array([float(time.monotonic() < end)]), op=hvd.Min, name="going")[0])
    during = sorted(os.sched_getaffinity(0))
finally:
    if hog:
        hog.kill()
        hog.wait()
hvd.shutdown()
report(bound=bound, during=during, ok=ok)
'''


@pytest.mark.parametrize("op", ["allreduce", "broadcast"])
def test_a_rank_whose_core_is_shared_with_a_busy_process_is_left_to_the_kernel(op: str) -> None:
    """A bound rank cannot move away from another job's busy process on its core, and its peer
    waits for it at every step: once it has waited to run for a quarter of the time, its binding
    goes (the results stay exact), whichever collectives the job runs."""
    cores = whole_machine()
    result = hvdrun(SHARED_CORE.format(hog=True, op=op)).check()
    for r in (0, 1):
        values = result.ranks[r]
        assert values["ok"] and len(values["bound"]) < len(cores)
        assert values["during"] == cores  # released: the kernel may move it away from the busy process


def test_a_rank_with_its_cores_to_itself_stays_bound() -> None:
    """The rank's own threads wait for each other (the engine's thread behind a caller that spins
    on the core): that is not other work, and the binding stays for the whole job."""
    cores = whole_machine()
    result = hvdrun(SHARED_CORE.format(hog=False, op="allreduce")).check()
    for r in (0, 1):
        values = result.ranks[r]
        assert values["ok"] and values["during"] == values["bound"] and len(values["bound"]) < len(cores)
