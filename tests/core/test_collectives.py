"""Every collective x dtype x op on real ranks, with exact expected values computed locally."""

import pytest

from multirank import hvdrun

EXACTNESS = r'''
import numpy as np
import horovod.numpy as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
dtypes = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "bfloat16"]
problems = []

def expect(label, got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got.astype(np.float64),
                                                                              want.astype(np.float64)):
        problems.append(f"{label}: got {got.dtype}{got.shape} {got.ravel()[:6]}, want {want.dtype}{want.shape} {want.ravel()[:6]}")

def dt(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)

for name in dtypes:
    d = dt(name)
    base = np.arange(6, dtype=np.float64).reshape(2, 3)
    mine = (base + r + 1).astype(d)
    every = [(base + k + 1).astype(d) for k in range(n)]
    f64 = [e.astype(np.float64) for e in every]
    expect(f"allreduce sum {name}", hvd.allreduce(mine, op=hvd.Sum, name=f"s{name}"), np.sum(f64, 0).astype(d))
    expect(f"allreduce min {name}", hvd.allreduce(mine, op=hvd.Min, name=f"mi{name}"), np.min(f64, 0).astype(d))
    expect(f"allreduce max {name}", hvd.allreduce(mine, op=hvd.Max, name=f"ma{name}"), np.max(f64, 0).astype(d))
    prod = np.prod(f64, 0) if name not in ("uint8", "int8") else None
    if prod is not None and np.all(prod < 30000):
        expect(f"allreduce product {name}", hvd.allreduce(mine, op=hvd.Product, name=f"p{name}"), prod.astype(d))
    avg = np.sum(f64, 0) / n
    want_avg = np.trunc(avg).astype(d) if d.kind in "iu" else avg.astype(d)
    expect(f"allreduce average {name}", hvd.allreduce(mine, name=f"a{name}"), want_avg)
    scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5, name=f"sc{name}")
    expect(f"allreduce scaled {name}", scaled, np.sum(f64, 0).astype(d))
    gathered = hvd.allgather(np.full((r + 1, 2), r + 1).astype(d), name=f"g{name}")
    expect(f"allgather {name}", gathered, np.concatenate([np.full((k + 1, 2), k + 1) for k in range(n)]).astype(d))
    expect(f"broadcast {name}", hvd.broadcast(mine, root_rank=n - 1, name=f"b{name}"), every[n - 1])
    send = np.stack([np.full(2, 10 * r + j) for j in range(n)]).astype(d)
    out, splits = hvd.alltoall(send, splits=[1] * n, name=f"t{name}")
    expect(f"alltoall {name}", out, np.stack([np.full(2, 10 * k + r) for k in range(n)]).astype(d))
    expect(f"alltoall splits {name}", splits, np.ones(n, np.int32))
    if name not in ("uint8", "int8"):
        rows = 2 * n + 1
        full = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2)
        part = hvd.reducescatter((full * (r + 1)).astype(d), op=hvd.Sum, name=f"r{name}")
        total = full * sum(k + 1 for k in range(n))
        start = sum(rows // n + (k < rows % n) for k in range(r))
        expect(f"reducescatter {name}", part, total[start:start + rows // n + (r < rows % n)].astype(d))

flags = np.array([r % 2 == 0, True])
expect("allreduce bool max", hvd.allreduce(flags, op=hvd.Max, name="bmax"), np.array([True, True]))
expect("allreduce bool min", hvd.allreduce(flags, op=hvd.Min, name="bmin"), np.array([n == 1, True]))
expect("allgather bool", hvd.allgather(flags, name="bg"), np.concatenate([np.array([k % 2 == 0, True]) for k in range(n)]))
expect("broadcast bool", hvd.broadcast(flags, 1, name="bb"), np.array([False, True]))

# uneven alltoall, including empty parts
send = np.arange(n * (r + 1), dtype=np.int32).reshape(-1, 1) + 100 * r
splits = [r + 1] * n
out, received = hvd.alltoall(send, splits=splits, name="uneven")
expect("alltoall uneven splits", received, np.array([k + 1 for k in range(n)], np.int32))
expect("alltoall uneven rows", out, np.concatenate([np.arange(n * (k + 1), dtype=np.int32).reshape(-1, 1)[r * (k + 1):(r + 1) * (k + 1)] + 100 * k for k in range(n)]))
empty, _ = hvd.alltoall(np.zeros((n, 2), np.float32), splits=[n] + [0] * (n - 1), name="lop")
expect("alltoall lopsided", empty, np.zeros((n * n if r == 0 else 0, 2), np.float32))

# large buffers take the ring path; exact with small integers
big = np.full(3_000_003, r + 1, np.float32)
expect("allreduce ring", hvd.allreduce(big, op=hvd.Sum, name="big"), np.full(3_000_003, n * (n + 1) / 2, np.float32))
expect("allgather big", hvd.allgather(np.full((300_001,), r, np.int64), name="bigg"), np.repeat(np.arange(n), 300_001))
# grouped ops and in-place async
grouped = hvd.grouped_allreduce([np.ones(3) * r, np.ones((2, 2), np.int32) * r], op=hvd.Sum, name="grp")
expect("grouped allreduce 0", grouped[0], np.ones(3) * sum(range(n)))
expect("grouped allreduce 1", grouped[1], np.ones((2, 2), np.int32) * sum(range(n)))
gg = hvd.grouped_allgather([np.full((1,), r), np.full((2, 1), r)], name="gg")
expect("grouped allgather", gg[1], np.repeat(np.arange(n), 2).reshape(-1, 1))
grs = hvd.grouped_reducescatter([np.ones((n, 2)), np.ones((2 * n,))], op=hvd.Sum, name="grs")
expect("grouped reducescatter", grs[1], np.full(2, float(n)))
inplace = np.ones(4) * (r + 1)
h = hvd.allreduce_async(inplace, op=hvd.Sum, name="inplace", output=inplace)
assert hvd.synchronize(h) is inplace
expect("in-place allreduce", inplace, np.ones(4) * n * (n + 1) / 2)
report(problems=problems, size=n)
'''


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_every_collective_dtype_and_op_is_exact(np_):
    result = hvdrun(EXACTNESS, np=np_).check()
    for rank, values in result.every_rank(np_):
        assert values["size"] == np_
        assert values["problems"] == [], f"rank {rank}: {values['problems']}"


@pytest.mark.parametrize("env", [
    {"HOROVOD_CACHE_CAPACITY": "0"},
    {"HOROVOD_FUSION_THRESHOLD": "0"},
    {"HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "5"},
], ids=["no-cache", "no-fusion", "neither"])
def test_exact_with_cache_and_fusion_switched_off(env):
    result = hvdrun(EXACTNESS, np=2, env=env).check()
    for rank, values in result.every_rank(2):
        assert values["problems"] == [], f"rank {rank}: {values['problems']}"


ORDERS = r'''
import random
import numpy as np
import horovod.numpy as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
names = [f"t{i}" for i in range(40)]
results = {}
for step in range(5):
    order = list(names)
    random.Random(1000 * r + step).shuffle(order)   # a different order on every rank and step
    handles = {nm: hvd.allreduce_async(np.full(int(nm[1:]) + 1, r + step, np.float32), name=nm, op=hvd.Sum)
               for nm in order}
    for nm, h in handles.items():
        want = sum(k + step for k in range(n))
        got = hvd.synchronize(h)
        results[nm] = bool(np.all(got == want) and got.size == int(nm[1:]) + 1)
report(all_ok=all(results.values()), count=len(results))
'''


@pytest.mark.parametrize("np_,env", [(2, {}), (3, {"HOROVOD_CACHE_CAPACITY": "0"}), (4, {"HOROVOD_CACHE_CAPACITY": "8"})],
                         ids=["2-cache", "3-nocache", "4-small-cache"])
def test_ranks_may_submit_in_different_orders(np_, env):
    result = hvdrun(ORDERS, np=np_, env=env).check()
    for _, values in result.every_rank(np_):
        assert values == {"all_ok": True, "count": 40}


UNNAMED = r'''
import numpy as np
import horovod.numpy as hvd
hvd.init()
r = hvd.rank()
ok = all(hvd.allreduce(np.full(3, r + i, np.float32), op=hvd.Sum).tolist() == [1.0 + 2 * i] * 3 for i in range(40))
# A metric averaged every step, as Horovod's examples do without a name, while named tensors repeat.
for step in range(40):
    ok &= hvd.allreduce(np.array([float(r)]))[0] == 0.5
    ok &= hvd.allreduce(np.full(2, step, np.float32), name="grad", op=hvd.Sum).tolist() == [2.0 * step] * 2
report(ok=bool(ok))
'''


def test_unnamed_ops_never_fill_the_response_cache():
    """Unnamed ops get a new name each (matched by order across ranks): remembering them would only
    evict the named tensors of a training step, and warn that the cache is too small."""
    result = hvdrun(UNNAMED, np=2, env={"HOROVOD_CACHE_CAPACITY": "4"}).check()
    for _, values in result.every_rank(2):
        assert values == {"ok": True}
    assert "response cache is full" not in result.stdout + result.stderr
