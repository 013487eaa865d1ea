"""horovod.torch and horovod.numpy where ml_dtypes cannot be imported (khorovod installed without
its [torch] extra): every dtype but bfloat16 must come back with its own dtype, shape and values,
and bfloat16 must fail with a message that names the missing package.

TensorFlow and Keras depend on ml_dtypes themselves, so only these two adapters can meet an
environment without it.
"""

import pytest

pytest.importorskip("torch")

from multirank import hvdrun  # noqa: E402

WITHOUT_ML_DTYPES = r'''
import sys
sys.modules["ml_dtypes"] = None  # `import ml_dtypes` now raises ImportError, as if not installed

import torch
import horovod.numpy as hnp
import horovod.torch as hvd
from horovod.common import reduce_ops

torch.set_num_threads(1)
hvd.init()
r, n = hvd.rank(), hvd.size()
bad = []

def cases(dt):
    """(label, result, expected) of every collective on two ranks holding `base + rank`."""
    base = torch.arange(6).reshape(2, 3) % 2
    mine, theirs = (base + r).to(dt), (base + 1 - r).to(dt)
    first, second = (mine, theirs) if r == 0 else (theirs, mine)
    if dt == torch.bool:
        op, total = hvd.Max, mine | theirs
    else:
        op, total = hvd.Sum, (mine.to(torch.float64) + theirs.to(torch.float64)).to(dt)
    yield "allreduce", hvd.allreduce(mine, op=op), total
    yield "allreduce_", hvd.allreduce_(mine.clone(), op=op), total
    yield "allreduce_async", hvd.synchronize(hvd.allreduce_async(mine, op=op)), total
    yield "grouped_allreduce", hvd.grouped_allreduce([mine, mine[0]], op=op)[1], total[0]
    yield "allgather", hvd.allgather(mine[: r + 1].contiguous()), torch.cat([first[:1], second])
    yield "broadcast", hvd.broadcast(mine, root_rank=1), second
    received = hvd.alltoall(mine, splits=[2, 0] if r == 0 else [1, 1])[0]
    yield "alltoall", received, torch.cat([first, second[:1]]) if r == 0 else second[1:]
    if dt not in (torch.bool, torch.uint8, torch.int8):
        yield "reducescatter", hvd.reducescatter(mine, op=hvd.Sum), total[r:r + 1]
    numpy_total = hnp.allreduce(mine.numpy(), op=op)
    yield "numpy allreduce", torch.from_numpy(numpy_total), total


for dt in [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
           torch.float64, torch.bool]:
    for label, got, want in cases(dt):
        if not (got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)):
            bad.append(f"{label} {dt}: got {got!r}, want {want!r}")

try:
    hvd.allreduce(torch.ones(3, dtype=torch.bfloat16))
    bfloat16_error = ""
except ValueError as exc:
    bfloat16_error = str(exc)
report(bad=bad, blocked=reduce_ops.BFLOAT16 is None, bfloat16_error=bfloat16_error)
'''


def test_every_dtype_without_ml_dtypes_on_two_ranks():
    result = hvdrun(WITHOUT_ML_DTYPES, np=2, timeout=120).check()
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["blocked"] is True
        assert got["bad"] == []
        assert "bfloat16 needs the ml_dtypes package" in got["bfloat16_error"]
