"""CUDA tensors on 2 real ranks sharing one GPU: every collective stages them through host memory
and hands back tensors on the caller's device with the same values the CPU path gives.

These need a CUDA device; CI has none, so there they skip, saying so. They ran on the device
machine (an H100) through scripts/device_check.sh; docs/performance.md has the run.
"""

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here); scripts/device_check.sh runs these on one",
                allow_module_level=True)

from multirank import hvdrun  # noqa: E402

COLLECTIVES_ON_CUDA = r'''
import torch
import horovod.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
dev = torch.device("cuda", torch.cuda.current_device())
bad = []

def same(label, got, want):
    """`got` must be on the GPU and equal the CPU-computed `want`."""
    if not isinstance(got, torch.Tensor) or got.device != dev:
        bad.append(f"{label}: on {getattr(got, 'device', type(got))}, not {dev}")
    elif got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got.cpu(), want):
        bad.append(f"{label}: got {got.cpu()!r}, want {want!r}")

for dt in (torch.float32, torch.float16, torch.bfloat16, torch.int64):
    k = str(dt)
    every = [(torch.arange(6).reshape(2, 3) + 10 * q).to(dt) for q in range(n)]
    mine = every[r].to(dev)
    total = sum(e.to(torch.float64) for e in every).to(dt)
    same(f"allreduce {k}", hvd.allreduce(mine, op=hvd.Sum), total)
    inplace = mine.clone()
    returned = hvd.allreduce_(inplace, op=hvd.Sum)
    same(f"allreduce_ {k}", inplace, total)
    if returned is not inplace:
        bad.append(f"allreduce_ {k}: did not return its input")
    same(f"grouped_allreduce {k}", hvd.grouped_allreduce([mine, mine[0]], op=hvd.Sum)[1], total[0])
    rows = mine[: r + 1].contiguous()
    same(f"allgather {k}", hvd.allgather(rows), torch.cat([e[: q + 1] for q, e in enumerate(every)]))
    target = mine.clone()
    hvd.broadcast_(target, root_rank=1)
    same(f"broadcast_ {k}", target, every[1])
    out, splits = hvd.alltoall(mine, splits=[2, 0] if r == 0 else [1, 1])
    same(f"alltoall {k}", out, torch.cat([every[0], every[1][:1]]) if r == 0 else every[1][1:])
    same(f"reducescatter {k}", hvd.reducescatter(mine, op=hvd.Sum), total[r:r + 1])

handle = hvd.allreduce_async(torch.full((1000,), float(r + 1), device=dev), op=hvd.Average)
same("allreduce_async Average", hvd.synchronize(handle), torch.full((1000,), 1.5))
report(bad=bad)
'''


def test_every_collective_takes_and_returns_cuda_tensors():
    result = hvdrun(COLLECTIVES_ON_CUDA, np=2, timeout=180).check()
    assert result.ranks[0]["bad"] == [] and result.ranks[1]["bad"] == [], result.ranks


TRAINING_ON_CUDA = r'''
import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
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
report(on_gpu=all(p.is_cuda for p in model.parameters()),
       gap=max((p.detach().cpu() - q.detach()).abs().max().item()
               for p, q in zip(model.parameters(), reference.parameters())),
       weights=[p.detach().cpu().flatten()[:4].tolist() for p in model.parameters()])
'''


def test_distributed_optimizer_trains_a_cuda_model_like_one_process_on_the_whole_batch():
    result = hvdrun(TRAINING_ON_CUDA, np=2, timeout=180).check()
    for rank in (0, 1):
        assert result.ranks[rank]["on_gpu"] is True
        assert result.ranks[rank]["gap"] < 1e-4, result.ranks  # GPU and CPU arithmetic differ in rounding only
    assert result.ranks[0]["weights"] == result.ranks[1]["weights"]
