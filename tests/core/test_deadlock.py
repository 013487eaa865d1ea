"""Ranks blocked in different collectives (typical after one rank failed part-way) raise on
every rank within seconds, naming what each rank waits for, and the job stays usable; a rank
that is merely slow is never mistaken for a deadlock."""

import pytest

from multirank import hvdrun

DIFFERENT_WAITS = r'''
import time
import numpy as np
import horovod.numpy as hvd

hvd.init()
r = hvd.rank()
started = time.monotonic()
try:
    if r == 0:
        hvd.allgather_object({"rank": r})
    elif r == 1:
        hvd.barrier()
    else:
        pending = hvd.allreduce_async(np.ones(2), name="early")  # async work of its own, then blocked
        hvd.broadcast_object("x", root_rank=0)
    report(error=None)
except hvd.HorovodInternalError as exc:
    report(error=str(exc), seconds=time.monotonic() - started)
report(after=hvd.allreduce(np.ones(1), op=hvd.Sum, name="after").tolist(), gathered=hvd.allgather_object(r))
'''


def test_ranks_blocked_in_different_collectives_all_raise_naming_each_wait():
    result = hvdrun(DIFFERENT_WAITS, np=3, timeout=60).check()
    for rank in range(3):
        got = result.ranks[rank]
        error = got["error"]
        assert error is not None and error.startswith("Deadlock in the global process set"), error
        assert "rank 0 waits for allgather.object.sz" in error
        assert "rank 1 waits for barrier.noname" in error
        assert "rank 2 waits for broadcast.object.sz" in error
        assert got["seconds"] < 20
        assert got["after"] == [3.0] and got["gathered"] == [0, 1, 2]


SLOW_PEER = r'''
import time
import numpy as np
import horovod.numpy as hvd

hvd.init()
if hvd.rank() == 1:
    time.sleep(6)  # computing, not blocked: the others must keep waiting for it
report(total=hvd.allreduce(np.ones(1), op=hvd.Sum, name="late").tolist())
hvd.barrier()
report(done=True)
'''


def test_a_slow_rank_is_not_a_deadlock():
    result = hvdrun(SLOW_PEER, np=2, timeout=60).check()
    for rank in (0, 1):
        assert result.ranks[rank] == {"total": [2.0], "done": True}
    assert "Deadlock" not in result.stdout + result.stderr


SUBSET = r'''
import numpy as np
import horovod.numpy as hvd

pair = hvd.ProcessSet([0, 1])
hvd.init(process_sets=[pair])
r = hvd.rank()
error = None
try:
    if r == 0:
        hvd.allreduce(np.ones(1), name="in_pair", process_set=pair)
    elif r == 1:
        hvd.barrier(process_set=pair)
except hvd.HorovodInternalError as exc:
    error = str(exc)
report(error=error, after=hvd.allreduce(np.ones(1), op=hvd.Sum, name="after").tolist())
'''


def test_a_deadlock_inside_a_process_set_fails_its_members_only():
    result = hvdrun(SUBSET, np=3, timeout=60).check()
    for rank in (0, 1):
        error = result.ranks[rank]["error"]
        assert error is not None and error.startswith("Deadlock in process set 1"), error
        assert "rank 0 waits for allreduce.in_pair" in error and "rank 1 waits for barrier.noname" in error
    assert result.ranks[2]["error"] is None
    assert all(result.ranks[rank]["after"] == [3.0] for rank in range(3))
