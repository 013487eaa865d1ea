"""op=Adasum on real ranks: the formula's result on every transport, fused and unfused, the
layout errors on every rank, and the torch delta optimizer converging where Sum diverges."""

import pytest

from adasum_reference import AGREES
from multirank import hvdrun

TWO_HOSTS = ["-H", "localhost:2,127.0.0.1:2"]



@pytest.mark.parametrize("np_,args,env", [
    (2, [], {}),
    (4, [], {}),
    (4, [], {"HOROVOD_CPU_OPERATIONS": "tcp"}),
    (4, TWO_HOSTS, {}),
], ids=["shm-2", "shm-4", "tcp-4", "two-hosts"])
def test_adasum_agrees_with_the_formula_fused_and_unfused(np_, args, env):
    result = hvdrun(AGREES, np=np_, args=args, env=env, timeout=180).check()
    for rank, values in result.every_rank(np_):
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
    for _, values in result.every_rank(3):
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
    weights = {tuple(v["weights"]) for _, v in adasum.every_rank(4)}
    assert len(weights) == 1  # every rank holds the same model
    for _, values in adasum.every_rank(4):
        assert values["is_sgd"]
        assert values["last"] < 1e-2 * values["first"], values
    for _, values in summed.every_rank(4):
        assert not values["last"] < values["first"], values  # Sum at this rate blows up (or goes nan)
