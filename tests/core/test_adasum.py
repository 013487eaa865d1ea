"""op=Adasum on real ranks: the formula's result on every transport, fused and unfused, the
layout errors on every rank, and the torch delta optimizer converging where Sum diverges."""

import pytest

from multirank import hvdrun

TWO_HOSTS = ["-H", "localhost:2,127.0.0.1:2"]

AGREES = r'''
import numpy as np
import horovod.numpy as hvd
from horovod.common import basics
from horovod.common.reduce_ops import SUPPORTED_DTYPES
from tests.support.adasum_reference import adasum

hvd.init()
r, n, local = hvd.rank(), hvd.size(), hvd.local_size()
problems = []
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-14}

def inputs(seed, shape, dtype):
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(shape)
    return [(shared + 0.5 * rng.standard_normal(shape)).astype(SUPPORTED_DTYPES[dtype]) for _ in range(n)]

def expected(per_rank, bounds):
    if basics.runtime().transport.name == "hierarchical" and local > 1:  # average in a host, Adasum across
        hosts = [sum(v.astype(np.float64) for v in per_rank[h:h + local]) / local for h in range(0, n, local)]
        return adasum([h.astype(per_rank[0].dtype) for h in hosts], bounds)
    return adasum(per_rank, bounds)

def check(what, got, want, dtype):
    got, want = np.asarray(got, np.float64), want.astype(np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype]):
        problems.append(f"{what}: max error {np.max(np.abs(got - want)) if got.shape == want.shape else got.shape}")

digests = []
for dtype in ("float16", "bfloat16", "float32", "float64"):
    for seed, shape in enumerate([(1,), (3, 5), (1000,), (257, 1031)]):
        per_rank = inputs(seed, shape, dtype)
        out = hvd.allreduce(per_rank[r], op=hvd.Adasum, name=f"one.{dtype}.{seed}")
        check(f"unfused {dtype} {shape}", out, expected([v.reshape(-1) for v in per_rank], [(0, out.size)]).reshape(shape), dtype)
        digests.append(np.asarray(out).tobytes().hex()[:64])
    # Fused: small tensors of one dtype travel in one buffer; each keeps its own coefficients.
    shapes = [(4,), (2, 3), (17,), (1,), (64, 8)]
    per_tensor = [inputs(100 + i, s, dtype) for i, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce([t[r] for t in per_tensor], op=hvd.Adasum, name=f"fused.{dtype}")
    for s, t, out in zip(shapes, per_tensor, outs):
        check(f"fused {dtype} {s}", out, expected([v.reshape(-1) for v in t], [(0, t[0].size)]).reshape(s), dtype)
        digests.append(np.asarray(out).tobytes().hex()[:64])
report(problems=problems, digests=digests, transport=basics.runtime().transport.name)
'''


@pytest.mark.parametrize("np_,args,env", [
    (2, [], {}),
    (4, [], {}),
    (4, [], {"HOROVOD_CPU_OPERATIONS": "tcp"}),
    (4, TWO_HOSTS, {}),
], ids=["shm-2", "shm-4", "tcp-4", "two-hosts"])
def test_adasum_agrees_with_the_formula_fused_and_unfused(np_, args, env):
    result = hvdrun(AGREES, np=np_, args=args, env=env, timeout=180).check()
    assert sorted(result.ranks) == list(range(np_))
    for rank, values in result.ranks.items():
        assert values["problems"] == [], f"rank {rank}: {values['problems']}"
    assert len({tuple(v["digests"]) for v in result.ranks.values()}) == 1  # identical bits everywhere
    if args:
        assert {v["transport"] for v in result.ranks.values()} == {"hierarchical"}


ERRORS = r'''
import numpy as np
import horovod.numpy as hvd
hvd.init()
caught = {}
for key, call in [("three", lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum)),
                  ("ints", lambda: hvd.allreduce(np.ones(4, np.int32), op=hvd.Adasum))]:
    try:
        call()
    except (NotImplementedError, ValueError) as exc:
        caught[key] = f"{type(exc).__name__}: {exc}"
report(caught=caught, after=hvd.allreduce(np.ones(2), op=hvd.Sum).tolist())
'''


def test_adasum_layout_and_dtype_errors_reach_every_rank():
    result = hvdrun(ERRORS, np=3).check()
    for values in result.ranks.values():
        assert values["caught"]["three"].startswith("NotImplementedError") and "power-of-two" in values["caught"]["three"]
        assert values["caught"]["ints"].startswith("ValueError") and "floating-point" in values["caught"]["ints"]
        assert values["after"] == [3.0, 3.0]


TRAIN = r'''
import os
import torch
import horovod.torch as hvd

hvd.init()
torch.manual_seed(0)
# A linear regression whose ranks see different, correlated data; at lr=1.0 the summed
# gradients of 4 ranks overshoot (4 x lr is past 2 / the largest curvature), Adasum does not.
true_w = torch.linspace(-1, 1, 16)
g = torch.Generator().manual_seed(1 + hvd.rank())
x = torch.randn(256, 16, generator=g) + 0.5
y = x @ true_w
model = torch.nn.Linear(16, 1, bias=False)
torch.nn.init.zeros_(model.weight)
op = hvd.Adasum if os.environ["OP"] == "adasum" else hvd.Sum
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                               named_parameters=model.named_parameters(), op=op)
losses = []
for step in range(60):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y) / 16
    loss.backward()
    opt.step()
    losses.append(float(loss))
report(first=losses[0], last=losses[-1], weights=model.weight.detach().reshape(-1).tolist(),
       is_sgd=isinstance(opt, torch.optim.SGD))
'''


def test_torch_adasum_optimizer_converges_where_sum_diverges():
    adasum = hvdrun(TRAIN, np=4, env={"OP": "adasum"}, timeout=180).check()
    summed = hvdrun(TRAIN, np=4, env={"OP": "sum"}, timeout=180).check()
    weights = {tuple(v["weights"]) for v in adasum.ranks.values()}
    assert len(weights) == 1  # every rank holds the same model
    for values in adasum.ranks.values():
        assert values["is_sgd"]
        assert values["last"] < 1e-2 * values["first"], values
    for values in summed.ranks.values():
        assert not values["last"] < values["first"], values  # Sum at this rate blows up (or goes nan)
