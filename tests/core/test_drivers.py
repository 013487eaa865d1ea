"""Who runs the engine: a thread blocked in a collective drives it, the engine thread drives
overlapped work, one at a time (the drive lock). These tests mix the two under contention, on
both data paths, and check every result exactly."""

import pytest

from multirank import hvdrun

MIXED_THREADS = r'''
import threading
import numpy as np
import horovod.numpy as hvd
hvd.init()
r, n = hvd.rank(), hvd.size()
ROUNDS, THREADS = 60, 3
errors, sums = [], {}

def blocking(k):
    # Each thread runs its own sequence of blocking collectives: every one of them may end up
    # driving the engine, racing the others and the engine thread for the drive lock.
    try:
        for i in range(ROUNDS):
            out = hvd.allreduce(np.full(7 + k, r + i, np.float64), op=hvd.Sum, name=f"t{k}.{i}")
            sums[(k, i)] = float(out[0])
            if i % 10 == 0:
                got = hvd.broadcast(np.full(3, r * 10 + k, np.int32), root_rank=n - 1, name=f"b{k}.{i}")
                assert got.tolist() == [(n - 1) * 10 + k] * 3, got
    except BaseException as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=blocking, args=(k,)) for k in range(THREADS)]
for t in threads:
    t.start()
# Meanwhile the main thread keeps async work in flight, driven by the engine thread until it
# synchronizes (then by itself).
async_ok = True
for i in range(ROUNDS):
    handles = [hvd.allreduce_async(np.full(1000, float(r), np.float32), op=hvd.Sum, name=f"a{i}.{j}")
               for j in range(3)]
    for h in handles:
        async_ok &= bool(np.all(hvd.synchronize(h) == sum(range(n))))
for t in threads:
    t.join(120)
expected = all(sums[(k, i)] == sum(range(n)) + n * i for k in range(THREADS) for i in range(ROUNDS))
report(errors=errors, exact=expected, async_ok=async_ok, alive=[t.is_alive() for t in threads])
'''


@pytest.mark.parametrize("np_, transport", [(2, "auto"), (3, "auto"), (2, "tcp")])
def test_blocking_threads_and_async_work_share_the_engine(np_, transport):
    result = hvdrun(MIXED_THREADS, np=np_, env={"HOROVOD_CPU_OPERATIONS": transport}, timeout=150).check()
    for rank in range(np_):
        values = result.ranks[rank]
        assert values["errors"] == [] and values["alive"] == [False] * 3
        assert values["exact"] is True and values["async_ok"] is True


PEER_STARTED = r'''
import time
import numpy as np
import horovod.numpy as hvd
hvd.init()
r = hvd.rank()
# Rank 1 submits late every time: rank 0's blocking caller starts each cycle and waits; rank 1's
# idle engine thread must answer those cycles (or its own caller must), never both and never
# neither, whatever the timing.
values = []
for i in range(40):
    if r == 1:
        time.sleep(0.002 * (i % 3))
    values.append(float(hvd.allreduce(np.array([r + i], np.float64), op=hvd.Sum, name=f"late.{i}")[0]))
report(values=values)
'''


def test_late_peer_every_time():
    result = hvdrun(PEER_STARTED, np=2).check()
    for rank in range(2):
        assert result.ranks[rank]["values"] == [float(1 + 2 * i) for i in range(40)]


CALLER_CYCLES = r'''
import threading
import numpy as np
import horovod.numpy as hvd
from horovod.common.engine.cycle import Cycle

# Count the cycles that the calling thread ran itself (the call itself runs unchanged).
by_caller = []
run = Cycle.run
def counted(self):
    if threading.current_thread() is threading.main_thread():
        by_caller.append(1)
    return run(self)
Cycle.run = counted

hvd.init()
r, n = hvd.rank(), hvd.size()
ROUNDS = 40
exact = True
for i in range(ROUNDS):
    x = np.full(5, float(r + i))
    if r == 1 and i % 2:
        # Rank 1 has "y" in flight when it submits "x": its cycle is a full one, with two ready
        # bits, while rank 0 offers "x" alone; both must run "x", then "y".
        handle = hvd.allreduce_async(np.full(3, float(r)), op=hvd.Sum, name="y")
        exact &= bool(np.all(hvd.allreduce(x, op=hvd.Sum, name="x") == sum(range(n)) + n * i))
        exact &= bool(np.all(hvd.synchronize(handle) == sum(range(n))))
    else:
        exact &= bool(np.all(hvd.allreduce(x, op=hvd.Sum, name="x") == sum(range(n)) + n * i))
        exact &= bool(np.all(hvd.allreduce(np.full(3, float(r)), op=hvd.Sum, name="y") == sum(range(n))))
report(exact=exact, by_caller=len(by_caller))
'''


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_callers_cycles_agree_with_a_peers_cycles_that_carry_other_work(transport):
    """A synchronous op runs its cycle on its caller's thread, offering that op alone; a peer
    that has another op in flight offers both meanwhile. Both sides must take the same decision
    from the same messages, every round."""
    result = hvdrun(CALLER_CYCLES, np=2, env={"HOROVOD_CPU_OPERATIONS": transport}).check()
    assert result.ranks[0]["exact"] is True and result.ranks[1]["exact"] is True
    # The callers ran cycles themselves (the engine thread may hold the engine at times).
    by_caller = [result.ranks[rank]["by_caller"] for rank in range(2)]
    assert by_caller[0] >= 40 and by_caller[1] > 0, by_caller


LEFT_TO_THE_ENGINE = r'''
import numpy as np
import horovod.numpy as hvd
from horovod.common import ops
hvd.init()
handles = []

def submit_then_fail():
    handles.append(hvd.allreduce_async(np.ones(3), op=hvd.Sum, name="left"))
    raise RuntimeError("the caller changed its mind")

try:
    ops.submit_waited(submit_then_fail)
except RuntimeError:
    pass
# A wait with a time limit only sleeps (it never runs the engine): the engine thread must have
# taken the op over when the caller that said it would wait did not.
result = handles[0].wait(timeout=60)
# The blocking form, the one entry point every bridge uses, still runs on the caller's thread.
again = ops.run_now(hvd.allreduce_async, np.full(2, 2.0), "again", hvd.Sum)
report(result=result.tolist(), again=again.tolist())
'''


def test_ops_submitted_for_a_wait_that_never_comes_are_left_to_the_engine_thread():
    """`ops.submit_waited` tells the engine not to wake its thread, as the caller will wait and
    drive; when the caller breaks off instead, the engine thread runs what was submitted."""
    result = hvdrun(LEFT_TO_THE_ENGINE, np=2).check()
    for rank in range(2):
        assert result.ranks[rank]["result"] == [2.0, 2.0, 2.0]
        assert result.ranks[rank]["again"] == [4.0, 4.0]
