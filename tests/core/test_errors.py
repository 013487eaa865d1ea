"""Errors: cross-rank mismatches raise on every rank and the job stays usable; local argument
errors raise ValueError on the calling rank before anything is sent."""

from multirank import hvdrun

MISMATCHES = r'''
import numpy as np
import horovod.numpy as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
errors = {}

def attempt(label, fn):
    try:
        fn()
        errors[label] = None
    except hvd.HorovodInternalError as exc:
        errors[label] = str(exc)
    # the job stays usable after every error
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="check." + label)[0] == n

attempt("dtype", lambda: hvd.allreduce(np.ones(2, np.float32 if r == 0 else np.int32), name="x1"))
attempt("shape", lambda: hvd.allreduce(np.ones(2 + r), name="x2"))
attempt("op", lambda: hvd.allreduce(np.ones(2), op=hvd.Sum if r == 0 else hvd.Max, name="x3"))
attempt("scale", lambda: hvd.allreduce(np.ones(2), prescale_factor=1.0 + r, name="x4"))
attempt("root", lambda: hvd.broadcast(np.ones(2), root_rank=r, name="x5"))
attempt("trailing", lambda: hvd.allgather(np.ones((2, 1 + r)), name="x6"))
attempt("ndim", lambda: hvd.allgather(np.ones((2,) * (1 + r)), name="x8"))
attempt("fine", lambda: hvd.allreduce(np.ones(2), name="x9"))
report(errors=errors)
'''


def test_mismatches_raise_on_every_rank_naming_ranks_and_values():
    result = hvdrun(MISMATCHES, np=2).check()
    for rank in (0, 1):
        errors = result.ranks[rank]["errors"]
        assert errors["fine"] is None
        assert "mismatched data types" in errors["dtype"] and "rank 0: float32" in errors["dtype"] \
            and "rank 1: int32" in errors["dtype"] and "allreduce.x1" in errors["dtype"]
        assert "shapes" in errors["shape"] and "rank 0: [2]" in errors["shape"] and "rank 1: [3]" in errors["shape"]
        assert "reduction operations" in errors["op"] and "Sum" in errors["op"] and "Max" in errors["op"]
        assert "prescale" in errors["scale"]
        assert "root ranks" in errors["root"] and "rank 0: 0" in errors["root"] and "rank 1: 1" in errors["root"]
        assert "trailing dimensions" in errors["trailing"] and "[1]" in errors["trailing"] and "[2]" in errors["trailing"]
        assert "number of dimensions" in errors["ndim"]


OP_TYPE = r'''
import numpy as np
import horovod.numpy as hvd
hvd.init()
r = hvd.rank()
try:
    if r == 0:
        hvd.allreduce(np.ones(2), name="same")
    else:
        hvd.allgather(np.ones(2), name="same")
    report(error=None)
except hvd.HorovodInternalError as exc:
    report(error=str(exc))
'''


def test_different_collectives_stall_and_the_stall_shutdown_names_them_on_every_rank():
    # Op names carry the collective ("allreduce.same" vs "allgather.same"), so ranks calling
    # different collectives never meet: the stall inspector reports it, and with a shutdown time
    # every rank fails with the list of what each rank was missing.
    result = hvdrun(OP_TYPE, np=2, env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1",
                                          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    for rank in (0, 1):
        error = result.ranks[rank]["error"]
        assert error is not None and "Missing ranks" in error
        assert "allreduce.same" in error and "allgather.same" in error


LOCAL = r'''
import numpy as np
import horovod.numpy as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
caught = {}

def attempt(label, fn, kind=ValueError):
    try:
        fn()
        caught[label] = None
    except kind as exc:
        caught[label] = str(exc)

h = hvd.allreduce_async(np.ones(2), name="dup")
attempt("duplicate", lambda: hvd.allreduce_async(np.ones(2), name="dup"))
hvd.synchronize(h)
attempt("root", lambda: hvd.broadcast(np.ones(2), root_rank=n + 3))
attempt("splits_len", lambda: hvd.alltoall(np.ones(4), splits=[4]))
attempt("splits_sum", lambda: hvd.alltoall(np.ones(4), splits=[4, 4]))
attempt("splits_uneven", lambda: hvd.alltoall(np.ones(3)))
attempt("dtype", lambda: hvd.allreduce(np.ones(2, np.complex64)))
attempt("contiguous", lambda: hvd.allreduce_async(np.ones((4, 4))[:, 1]))
attempt("rs_op", lambda: hvd.reducescatter(np.ones(4), op=hvd.Max))
attempt("bool_avg", lambda: hvd.allreduce(np.ones(2, bool)))
attempt("scalar_gather", lambda: hvd.allgather(np.float32(1.0).reshape(())))
attempt("adasum", lambda: hvd.allreduce(np.ones(2, np.int32), op=hvd.Adasum))
ps = hvd.ProcessSet([0])
attempt("unregistered", lambda: hvd.allreduce(np.ones(2), process_set=ps))
# the job is still fine, and nothing was sent for the rejected calls
ok = hvd.allreduce(np.ones(2), op=hvd.Sum, name="after")
report(caught=caught, after=ok.tolist())
'''


def test_local_argument_errors_raise_value_error_on_the_calling_rank():
    result = hvdrun(LOCAL, np=2).check()
    for rank in (0, 1):
        caught = result.ranks[rank]["caught"]
        assert result.ranks[rank]["after"] == [2.0, 2.0]
        assert all(message for message in caught.values()), caught
        assert "already in flight" in caught["duplicate"] and "allreduce.dup" in caught["duplicate"]
        assert "root_rank" in caught["root"]
        assert "splits" in caught["splits_len"] and "splits" in caught["splits_sum"]
        assert "divide evenly" in caught["splits_uneven"]
        assert "complex64 is not supported" in caught["dtype"]
        assert "not contiguous" in caught["contiguous"]
        assert "Average or op=Sum" in caught["rs_op"]
        assert "bool" in caught["bool_avg"]
        assert "rank-zero" in caught["scalar_gather"]
        assert "Adasum" in caught["adasum"]
        assert "not registered" in caught["unregistered"]


BEFORE_INIT = r'''
import numpy as np
import horovod.numpy as hvd
messages = []
for fn in (hvd.size, hvd.rank, hvd.local_rank, hvd.local_size, hvd.cross_rank, hvd.cross_size,
           lambda: hvd.allreduce(np.ones(1))):
    try:
        fn()
        messages.append(None)
    except ValueError as exc:
        messages.append(str(exc))
report(messages=messages, initialized=hvd.is_initialized())
'''


def test_queries_before_init_say_to_call_init():
    result = hvdrun(BEFORE_INIT, np=1).check()
    assert result.ranks[0]["initialized"] is False
    assert result.ranks[0]["messages"] == ["Horovod has not been initialized; use hvd.init()."] * 7
