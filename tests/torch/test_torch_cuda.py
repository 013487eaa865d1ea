"""CUDA tensors on 2 real ranks sharing one GPU, on both device routes: NCCL, and host staging.

Every collective, on every dtype, must give on the GPU what the same call gives on the CPU, with
the result on the caller's device. The NCCL route needs NCCL to accept two ranks on one GPU:
each rank gets its own NCCL_HOSTID (NCCL then treats them as two hosts over its socket
transport, on loopback), or NCCL_MULTI_RANK_GPU_ENABLE=1 where NCCL is 2.30 or later.

These need a CUDA device; CI has none, so there they skip, saying so. scripts/device_check.sh
runs them on the device machine; docs/gpu.md has what ran where.
"""

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here); scripts/device_check.sh runs these on one",
                allow_module_level=True)

import lightning_job  # noqa: E402
from multirank import hvdrun  # noqa: E402

# Per route: the environment of the job. "nccl": each rank its own NCCL host id (set by the
# script from HOROVOD_RANK before hvd.init()), NCCL over sockets on loopback, plus what
# KHOROVOD_TEST_NCCL_ENV adds ("NAME=value NAME=value": what scripts/device_check.sh found to work).
ROUTES = {
    "nccl": {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "OWN_NCCL_HOSTID": "1",
             **dict(item.split("=", 1) for item in os.environ.get("KHOROVOD_TEST_NCCL_ENV", "").split())},
    "staged": {"HOROVOD_GPU_OPERATIONS": "MPI"},
}

PRELUDE = r'''
import os
if os.environ.get("OWN_NCCL_HOSTID"):
    os.environ["NCCL_HOSTID"] = "khorovod-test-rank-" + os.environ["HOROVOD_RANK"]
import torch
import horovod.torch as hvd
from horovod.common import basics

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
dev = torch.device("cuda", torch.cuda.current_device())


def routes():
    """Which transport served each group: '' for NCCL, else why not."""
    device = basics.runtime().engine.cycle.executor.device
    return {str(list(group)): why for group, why in device.routes.items()}
'''

COLLECTIVES = PRELUDE + r'''
bad = []


def same(label, got, want, exact=True):
    """`got` must be on the GPU and equal (or close to) `want`, the CPU path's answer."""
    if isinstance(got, (list, tuple)):
        for i, (g, w) in enumerate(zip(got, want)):
            same(f"{label}[{i}]", g, w, exact)
        return
    if not isinstance(got, torch.Tensor) or got.device != dev:
        bad.append(f"{label}: on {getattr(got, 'device', type(got))}, not {dev}")
    elif got.dtype != want.dtype or got.shape != want.shape:
        bad.append(f"{label}: {got.dtype} {tuple(got.shape)}, want {want.dtype} {tuple(want.shape)}")
    elif exact and not torch.equal(got.cpu(), want):
        bad.append(f"{label}: got {got.cpu()!r}, want {want!r}")
    elif not exact and not torch.allclose(got.cpu().double(), want.double(), rtol=1e-2, atol=1e-2):
        bad.append(f"{label}: got {got.cpu()!r}, want about {want!r}")


def both(label, fn, tensors, exact=True):
    """Run `fn` on the CPU tensors and on their CUDA copies; the answers must agree."""
    want = fn(*tensors)
    got = fn(*(t.to(dev) for t in tensors))
    torch.cuda.synchronize()
    same(label, got, want, exact)


DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.bool)
for dt in DTYPES:
    k = str(dt).replace("torch.", "")
    x = ((torch.arange(12).reshape(4, 3) + 3 * r) % 7).to(dt)
    floating = dt.is_floating_point
    ops = [hvd.Sum, hvd.Min, hvd.Max] + ([hvd.Product] if dt != torch.bool else [])
    ops += [hvd.Average] if dt != torch.bool else []
    for op in ops:
        both(f"allreduce {k} op={op}", lambda t: hvd.allreduce(t, op=op, name=f"ar.{k}.{op}"), [x])
    if floating:
        both(f"allreduce {k} scaled", lambda t: hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5,
                                                              postscale_factor=3.0, name=f"sc.{k}"), [x], exact=False)
        both(f"allreduce {k} Max scaled", lambda t: hvd.allreduce(t, op=hvd.Max, postscale_factor=2.0,
                                                                  name=f"mxs.{k}"), [x])
    both(f"allreduce_ {k}", lambda t: hvd.allreduce_(t.clone(), op=hvd.Sum, name=f"ip.{k}"), [x])
    both(f"grouped_allreduce {k}", lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, name=f"g.{k}"),
         [x, x[0].contiguous()])
    both(f"allgather {k}", lambda t: hvd.allgather(t, name=f"ag.{k}"), [x[: r + 1].contiguous()])
    both(f"broadcast {k}", lambda t: hvd.broadcast(t, root_rank=1, name=f"bc.{k}"), [x])
    both(f"broadcast_ {k}", lambda t: hvd.broadcast_(t.clone(), root_rank=0, name=f"bci.{k}"), [x])
    both(f"alltoall {k}", lambda t: hvd.alltoall(t, splits=[3, 1] if r == 0 else [1, 3], name=f"a2a.{k}")[0], [x])
    if dt in (torch.int32, torch.int64, torch.float16, torch.float32, torch.float64):  # Horovod's reducescatter types
        both(f"reducescatter {k}", lambda t: hvd.reducescatter(t, op=hvd.Sum, name=f"rs.{k}"), [x])
        both(f"reducescatter {k} uneven", lambda t: hvd.reducescatter(t, op=hvd.Sum, name=f"rsu.{k}"),
             [x[:3].contiguous()])
    if dt in (torch.float16, torch.float32, torch.float64):
        both(f"reducescatter {k} Average", lambda t: hvd.reducescatter(t, name=f"rsa.{k}"), [x], exact=False)

# Adasum (through host memory on every route), process sets, join-free barrier, async.
v = torch.tensor([1.0, 2.0, 3.0, 4.0]) * (r + 1)
both("adasum", lambda t: hvd.allreduce(t, op=hvd.Adasum, name="adasum"), [v], exact=False)
hvd.barrier()
handle = hvd.allreduce_async(torch.full((1000,), float(r + 1), device=dev), op=hvd.Average)
same("allreduce_async Average", hvd.synchronize(handle), torch.full((1000,), 1.5))
big = torch.full((1 << 22,), float(r + 1), device=dev)
same("allreduce 16 MiB", hvd.allreduce(big, op=hvd.Sum), torch.full((1 << 22,), 3.0))
report(bad=bad, routes=routes())
'''


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_collective_on_every_dtype_matches_the_cpu(route):
    result = hvdrun(COLLECTIVES, np=2, env=ROUTES[route], timeout=240).check()
    for rank in (0, 1):
        assert result.ranks[rank]["bad"] == [], result.ranks[rank]["bad"]
    if route == "nccl":
        assert result.ranks[0]["routes"] == {"[0, 1]": ""}, result.ranks[0]["routes"]
    else:
        assert result.ranks[0]["routes"] == {}, result.ranks[0]["routes"]


TRAINING = PRELUDE + r'''
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(r)  # different initial weights: broadcast_parameters must make them equal
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
hvd.broadcast_parameters(model.named_parameters(), root_rank=0)  # parameters that require grad
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(opt, root_rank=0)
dopt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())

# The same steps on the CPU, from rank 0's weights, on both ranks' batches at once.
reference = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
batches = [(torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * s + q)),
            torch.randint(0, 3, (4,), generator=torch.Generator().manual_seed(100 * s + q + 50)))
           for s in range(5) for q in range(n)]
for s in range(5):
    x, y = batches[s * n + r]
    dopt.zero_grad()
    F.cross_entropy(model(x.cuda()), y.cuda()).backward()
    dopt.step()
    ref_opt.zero_grad()
    sum(F.cross_entropy(reference(bx), by) for bx, by in batches[s * n:(s + 1) * n]).div(n).backward()
    ref_opt.step()
report(on_gpu=all(p.is_cuda for p in model.parameters()), routes=routes(),
       gap=max((p.detach().cpu() - q.detach()).abs().max().item()
               for p, q in zip(model.parameters(), reference.parameters())),
       weights=[p.detach().cpu().flatten()[:4].tolist() for p in model.parameters()])
'''


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_distributed_optimizer_trains_a_cuda_model_like_one_process_on_the_whole_batch(route):
    result = hvdrun(TRAINING, np=2, env=ROUTES[route], timeout=180).check()
    for rank in (0, 1):
        assert result.ranks[rank]["on_gpu"] is True
        assert result.ranks[rank]["gap"] < 1e-4, result.ranks  # GPU and CPU arithmetic differ in rounding only
    assert result.ranks[0]["weights"] == result.ranks[1]["weights"]
    if route == "nccl":
        assert result.ranks[0]["routes"] == {"[0, 1]": ""}, result.ranks[0]["routes"]


KILLED = PRELUDE + r'''
import time
from horovod.common.exceptions import HorovodInternalError

x = torch.ones(16 << 20, device=dev)  # 64 MiB
error, waited = None, None
try:
    for step in range(200):
        hvd.allreduce_(x, op=hvd.Average, name="x")  # queued: the host goes on at once
        if r == 1 and step == 5:
            report(died=time.time())
            os._exit(1)  # mid-allreduce: rank 0's kernel waits for this rank's data
        torch.cuda.synchronize()
except HorovodInternalError as exc:
    error, waited = str(exc), time.time()
report(error=error, caught=waited, routes=routes())
'''


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_rank_killed_mid_allreduce_makes_the_survivor_fail_within_seconds(route):
    result = hvdrun(KILLED, np=2, env=ROUTES[route], timeout=120)
    survivor = result.ranks[0]
    assert survivor.get("error") and "rank 1" in survivor["error"], result.stdout + result.stderr
    waited = survivor["caught"] - result.ranks[1]["died"]
    print(f"{route}: the survivor raised {waited:.2f} s after rank 1 died")
    assert waited < 30, waited


ROUNDS = PRELUDE + r'''
seen = []
for round_ in range(2):  # shutdown and init again, as elastic training resets: a new communicator each round
    if round_:
        hvd.shutdown()
        hvd.init()
    y = hvd.allreduce(torch.full((1 << 16,), float(r + 1), device=dev), op=hvd.Sum, name="again")
    seen.append([y[0].item(), routes()])
report(seen=seen)
'''


@pytest.mark.parametrize("route", ["nccl"])
def test_a_new_round_builds_new_communicators(route):
    result = hvdrun(ROUNDS, np=2, env=ROUTES[route], timeout=120).check()
    for rank in (0, 1):
        assert result.ranks[rank]["seen"] == [[3.0, {"[0, 1]": ""}], [3.0, {"[0, 1]": ""}]], result.ranks[rank]


SETS_AND_JOIN = PRELUDE.replace("hvd.init()", "hvd.init(process_sets=[hvd.ProcessSet([1])])") + r'''
odd = basics.runtime().process_sets[1]
x = torch.full((8,), float(r + 1), device=dev)
got = {"global": hvd.allreduce(x, op=hvd.Sum, name="everyone")[0].item()}
if r == 1:  # a set of one member: its own communicator
    got["set"] = hvd.allreduce(x, op=hvd.Sum, name="alone", process_set=odd)[0].item()
    got["last"] = hvd.join()
else:  # rank 1 has joined: it contributes zeros, and Average still divides by 2
    got["joined"] = hvd.allreduce(x, op=hvd.Average, name="while_joined")[0].item()
    got["last"] = hvd.join()
report(got=got, routes=routes())
'''


@pytest.mark.parametrize("route", ["nccl"])
def test_process_sets_and_join_on_the_gpu(route):
    result = hvdrun(SETS_AND_JOIN, np=2, env=ROUTES[route], timeout=120).check()
    assert result.ranks[0]["got"] == {"global": 3.0, "joined": 0.5, "last": 0}, result.ranks[0]
    assert result.ranks[1]["got"] == {"global": 3.0, "set": 2.0, "last": 0}, result.ranks[1]
    assert result.ranks[1]["routes"] == {"[0, 1]": "", "[1]": ""}, result.ranks[1]["routes"]


# Horovod's mixed-precision idiom: synchronize, unscale, then step inside skip_synchronize. Each
# rank's data differs; on step 2 rank 1's batch overflows, so the averaged gradients hold an inf
# on both ranks and both must skip that step and halve their scale. Reading the gradients right
# after backward() (no synchronize) must already give the averaged ones.
AMP = PRELUDE + r'''
import copy

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(dev)
plain = copy.deepcopy(model)  # no hooks: this rank's own gradients, averaged by hand below
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
gaps, scales, skipped = [], [], []
for step in range(4):
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(10 * step + r)).to(dev)
    if step == 2 and r == 1:
        x[0, 0] = float("inf")
    opt.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    after_backward = [p.grad.clone() for p in model.parameters()]
    plain.load_state_dict(model.state_dict())
    plain.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        scaler.scale(plain(x).float().pow(2).mean()).backward()
    want = [hvd.allreduce(p.grad, op=hvd.Average, name=f"want.{step}.{i}") for i, p in enumerate(plain.parameters())]
    if step != 2:
        gaps.append(max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(after_backward, want)))
    before = [p.detach().clone() for p in model.parameters()]
    opt.synchronize()
    scaler.unscale_(opt)
    with opt.skip_synchronize():
        scaler.step(opt)
    scaler.update()
    scales.append(scaler.get_scale())
    skipped.append(all(torch.equal(a, p) for a, p in zip(before, model.parameters())))
report(gaps=gaps, scales=scales, skipped=skipped, on_gpu=all(p.is_cuda for p in model.parameters()),
       weights=[p.detach().cpu().flatten()[:4].tolist() for p in model.parameters()], routes=routes())
'''


@pytest.mark.parametrize("route", ["nccl"])
def test_backward_returns_averaged_gradients_and_amp_skips_the_same_steps(route):
    result = hvdrun(AMP, np=2, env=ROUTES[route], timeout=150).check()
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["on_gpu"] is True
        assert max(got["gaps"]) < 1e-3, got["gaps"]  # fp16 rounding of the same sums, nothing more
        assert got["skipped"] == [False, False, True, False], got
        assert got["scales"][2] == got["scales"][1] / 2, got["scales"]
        assert got["routes"] == {"[0, 1]": ""}, got["routes"]
    assert result.ranks[0]["weights"] == result.ranks[1]["weights"]


# The khorovod extensions on CUDA: the sharded optimizer against DistributedOptimizer, and PowerSGD
# (exact at full rank; at low rank, error feedback keeps what the approximations lost).
EXTENSIONS = PRELUDE + r'''
torch.manual_seed(0)
X, Y = torch.randn(12, 5, dtype=torch.float64).to(dev), torch.randn(12, 3, dtype=torch.float64).to(dev)
ROWS = torch.arange(12, device=dev)[r::n]


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double().to(dev)


def train(model, opt, rows, steps=4):
    for _ in range(steps):
        opt.zero_grad()
        (((model(X[rows]) - Y[rows]) ** 2).sum() / len(rows)).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


plain, sharded = make(), make()
adam_plain = train(plain, hvd.DistributedOptimizer(torch.optim.Adam(plain.parameters(), lr=0.01),
                                                   named_parameters=plain.named_parameters()), ROWS)
sharded_opt = hvd.ShardedDistributedOptimizer(torch.optim.Adam(sharded.parameters(), lr=0.01),
                                              named_parameters=sharded.named_parameters())
adam_sharded = train(sharded, sharded_opt, ROWS)
state = [v for s in sharded_opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]

single = make()
reference = train(single, torch.optim.SGD(single.parameters(), lr=0.1, momentum=0.9), torch.arange(12, device=dev))


def with_powersgd(**options):
    model = make()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   compression=hvd.Compression.powersgd(**options))
    return train(model, opt, ROWS)


full_rank = with_powersgd(matrix_approximation_rank=7, start_powerSGD_iter=1, min_compression_rate=0)
weight = torch.nn.Parameter(torch.zeros(6, 8, dtype=torch.float64, device=dev))
compression = hvd.Compression.powersgd(matrix_approximation_rank=1, start_powerSGD_iter=2)
opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=0.1), named_parameters=[("w", weight)],
                               compression=compression)
generator = torch.Generator().manual_seed(10 + r)
expected = torch.zeros(6, 8, dtype=torch.float64, device=dev)
for step in range(6):
    c = torch.randn(6, 8, generator=generator, dtype=torch.float64).to(dev)
    expected -= 0.1 * hvd.allreduce(c, op=hvd.Average, name=f"expected.{step}")
    opt.zero_grad()
    (weight * c).sum().backward()
    opt.step()
left = hvd.allreduce(compression.error_of("w"), op=hvd.Average, name="left")
report(sharded_vs_plain=(adam_sharded - adam_plain).abs().max().item(),
       state_on_gpu=all(v.is_cuda for v in state), state_numel=sum(v.numel() for v in state),
       full_numel=2 * sum(p.numel() for p in sharded.parameters()),
       full_rank=(full_rank - reference).abs().max().item(),
       low_rank=(weight.detach() - 0.1 * left - expected).abs().max().item(),
       lossy=compression.error_of("w").abs().max().item(), weight_on_gpu=weight.is_cuda, routes=routes())
'''


@pytest.mark.parametrize("route", ["nccl"])
def test_sharded_optimizer_and_powersgd_on_the_gpu(route):
    result = hvdrun(EXTENSIONS, np=2, env=ROUTES[route], timeout=150).check()
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["sharded_vs_plain"] < 1e-12, got
        assert got["state_on_gpu"] is True and got["state_numel"] <= got["full_numel"] // 2 + 2, got
        assert got["full_rank"] < 1e-9, got
        assert got["low_rank"] < 1e-9 and got["lossy"] > 1e-3, got  # lossy, yet nothing lost in the end
        assert got["weight_on_gpu"] is True
        assert got["routes"] == {"[0, 1]": ""}, got["routes"]


# The Lightning strategy the Spark estimators give their Trainer, on the GPU.
LIGHTNING = PRELUDE + lightning_job.fit("gpu")


@pytest.mark.parametrize("route", ["nccl"])
def test_the_lightning_strategy_trains_on_the_gpu(route):
    pytest.importorskip("lightning")
    result = hvdrun(LIGHTNING, np=2, env=ROUTES[route], timeout=180).check()
    lightning_job.check(result, "cuda:0", {"[0, 1]": ""})
