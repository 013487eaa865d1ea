"""prescale/postscale arithmetic is Horovod's, bit for bit: integers scaled in float64, float16 in
float32 (the factor rounded to float32), float32 in float32, float64 in float64; Average is Sum
with the postscale divided by the set size. Every rank sends the same tensor, so the reduction
order cannot change the result and the expected values are exact."""

import pytest

from multirank import hvdrun

SCALING = r'''
import numpy as np
import horovod.numpy as hvd

hvd.init()
n = hvd.size()
PRE, POST = 0.1, 1.7
problems = []

def scaled(x, factor):
    """Horovod's CPU scaling, written out per dtype."""
    if x.dtype.kind in "iu":
        return np.trunc(x.astype(np.float64) * factor).astype(x.dtype)
    if x.dtype == np.float16:
        return (x.astype(np.float32) * np.float32(factor)).astype(np.float16)
    return (x * x.dtype.type(factor)).astype(x.dtype)

def expected(x, op):
    part = scaled(x, PRE)
    total = part.copy()
    for _ in range(n - 1):
        total = (total + part).astype(x.dtype)
    return scaled(total, POST / n if op == hvd.Average else POST)

def check(label, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))[:3]
        problems.append(f"{label}: first differences at {bad.tolist()}: got {got.reshape(-1)[bad].tolist()}, "
                        f"want {want.reshape(-1)[bad].tolist()}")

# Small tensors take the whole-buffer path; ~1 MiB ones the paths that scale piece by piece.
for rows in (6 * n, 6 * n * 2048):
    for name in ["float16", "float32", "float64", "int32", "int64", "uint8"]:
        dtype = np.dtype(name)
        top = 30 if name == "uint8" else 2000
        x = (np.arange(rows * 5) % top).astype(dtype).reshape(rows, 5)
        if dtype.kind == "f":
            x = (x * dtype.type(0.37)).astype(dtype)
        for op in (hvd.Sum, hvd.Average):
            tag = f"{name}.{op}.{rows}"
            want = expected(x, op)
            check(f"allreduce {tag}", hvd.allreduce(x, op=op, prescale_factor=PRE, postscale_factor=POST,
                                                    name=f"a.{tag}"), want)
            fused = hvd.grouped_allreduce([x, x[:2]], op=op, prescale_factor=PRE, postscale_factor=POST,
                                          name=f"g.{tag}")
            check(f"grouped_allreduce {tag}", fused[0], want)
            check(f"grouped_allreduce[1] {tag}", fused[1], expected(x[:2], op))
            block = slice(hvd.rank() * rows // n, (hvd.rank() + 1) * rows // n)
            check(f"reducescatter {tag}", hvd.reducescatter(x, op=op, prescale_factor=PRE, postscale_factor=POST,
                                                            name=f"r.{tag}"), want[block])
            parts = hvd.grouped_reducescatter([x, x + 1], op=op, prescale_factor=PRE, postscale_factor=POST,
                                              name=f"gr.{tag}")
            check(f"grouped_reducescatter {tag}", parts[0], want[block])
            check(f"grouped_reducescatter[1] {tag}", parts[1], expected((x + 1).astype(dtype), op)[block])
report(problems=problems)
'''


@pytest.mark.parametrize("np_,args", [(2, []), (3, []), (4, ["-H", "localhost:2,127.0.0.1:2"])],
                         ids=["2", "3", "two-hosts"])
def test_scaled_collectives_are_bit_identical_to_horovods_arithmetic(np_, args):
    result = hvdrun(SCALING, np=np_, args=args, timeout=180).check()
    for rank in range(np_):
        assert result.ranks[rank]["problems"] == [], result.ranks[rank]["problems"]
