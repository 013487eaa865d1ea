"""A lone small allreduce travels with the negotiation: each member sends its contribution inside
its status message and, when every member did so for the same op, reduces them itself, with no
exchange of the transport's own. Real ranks through horovodrun, in Horovod's idiom (a named
`hvd.allreduce` per step, as a training loop averages its metrics): the answers must be exact and
the same on every rank, for every dtype and op, and the transport's allreduce must run only for
what cannot go so (a tensor's first op, before the response cache knows it; a large tensor)."""

import pytest

from multirank import hvdrun

EAGER = r'''
import torch
import horovod.torch as hvd
from horovod.common import runtime

hvd.init()
r, n = hvd.rank(), hvd.size()
transport = type(runtime.current().transport)
calls = []
inner = transport.allreduce_scaled


def counted(self, group, buf, op, postscale):  # counts the transport's own allreduces, and runs them
    calls.append(buf.nbytes)
    return inner(self, group, buf, op, postscale)


transport.allreduce_scaled = counted
problems, results = [], []
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]


def mine(k, step, dtype):
    return ((torch.arange(6, dtype=torch.float64).reshape(2, 3) + k + step) % 5 + 1).to(dtype)


def check(label, got, want, exact=True):
    """`got` must be `want` (or, where a division rounds, close to it; the ranks' agreement is checked apart)."""
    results.append(got.double().flatten().tolist())
    same = torch.equal if exact else lambda a, b: torch.allclose(a, b, rtol=1e-2)
    if got.dtype != want.dtype or got.shape != want.shape or not same(got.double(), want.double()):
        problems.append(f"{label}: got {got.dtype} {got.flatten().tolist()}, want {want.dtype} {want.flatten().tolist()}")


ops_per_step = 0
for step in range(3):
    ops = 0
    for dtype in DTYPES:
        k = str(dtype).replace("torch.", "")
        every = torch.stack([mine(q, step, torch.float64) for q in range(n)])
        for op, want in ((hvd.Sum, every.sum(0)), (hvd.Min, every.min(0).values), (hvd.Max, every.max(0).values),
                         (hvd.Product, every.prod(0))):
            if op == hvd.Product and dtype in (torch.uint8, torch.int8):
                continue  # 5 ** 3 overflows them
            check(f"step {step} {k} op {op}", hvd.allreduce(mine(r, step, dtype), op=op, name=f"{k}.{op}"),
                  want.to(dtype))
            ops += 1
        if dtype.is_floating_point:
            check(f"step {step} {k} average", hvd.allreduce(mine(r, step, dtype), name=f"{k}.avg"),
                  (every.sum(0) / n).to(dtype), exact=False)  # Horovod multiplies by 1 / n
            scaled = hvd.allreduce(mine(r, step, dtype), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                                   name=f"{k}.scaled")
            check(f"step {step} {k} scaled", scaled, (every.sum(0) / 2).to(dtype))
            ops += 2
        inplace = mine(r, step, dtype)
        hvd.allreduce_(inplace, op=hvd.Sum, name=f"{k}.inplace")
        check(f"step {step} {k} in place", inplace, every.sum(0).to(dtype))
        ops += 1
    flags = torch.tensor([r % 2 == 0, True, step == 1])
    check(f"step {step} bool max", hvd.allreduce(flags, op=hvd.Max, name="bool.max"),
          torch.tensor([True, True, step == 1]))
    check(f"step {step} bool min", hvd.allreduce(flags, op=hvd.Min, name="bool.min"),
          torch.tensor([n == 1, True, step == 1]))
    big = torch.full((8192,), float(r + step))  # 32 KiB: through the transport on every step
    check(f"step {step} large", hvd.allreduce(big, op=hvd.Sum, name="large"),
          torch.full((8192,), float(sum(q + step for q in range(n)))))
    ops_per_step = ops + 3
report(problems=problems, results=results, calls=calls, ops_per_step=ops_per_step)
'''


@pytest.mark.parametrize("np_", [2, 3])
def test_small_allreduces_go_with_the_negotiation_exact_on_every_rank(np_):
    result = hvdrun(EAGER, np=np_, timeout=180).check()
    for rank, got in result.every_rank(np_):
        assert got["problems"] == [], f"rank {rank}: {got['problems']}"
        assert got["results"] == result.ranks[0]["results"]
        # Step 0: every op through the transport (each tensor's first negotiation). Steps 1-2:
        # only the large tensor's; every small op went with the negotiation.
        assert len(got["calls"]) == got["ops_per_step"] + 2, (rank, got["calls"])
        assert got["calls"][-2:] == [32768, 32768], got["calls"]


@pytest.mark.parametrize("env", [{"HOROVOD_CACHE_CAPACITY": "0"}], ids=["no-cache"])
def test_without_the_response_cache_every_op_takes_the_transport(env):
    result = hvdrun(EAGER, np=2, env=env, timeout=180).check()
    for rank, got in result.every_rank(2):
        assert got["problems"] == [], f"rank {rank}: {got['problems']}"
        assert len(got["calls"]) == 3 * got["ops_per_step"]
