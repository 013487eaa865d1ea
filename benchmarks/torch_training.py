"""Training throughput: khorovod's DistributedOptimizer against PyTorch DistributedDataParallel.

    horovodrun -np 2 python benchmarks/torch_training.py
    horovodrun -np 2 python benchmarks/torch_training.py --model cnn --batch-size 32
    horovodrun -np 2 python benchmarks/torch_training.py --model mnist --steps 50
    horovodrun -np 2 python benchmarks/torch_training.py --threads 4     # on a machine with the cores
    horovodrun -np 2 python benchmarks/torch_training.py --device cuda   # on the GPU: NCCL against DDP's NCCL

Both run in the same job on the same ranks, with the same model, batch and optimizer, one
intra-op thread per rank unless --threads says otherwise (with spare cores, communication can
overlap the backward pass). On --device cuda the model and data live on the GPU, and both
reduce gradients with NCCL (DDP over `--ddp-backend nccl`, its default there; gloo stages
through host memory). They alternate in rounds (khorovod then DDP, then DDP then khorovod, ...)
so that whatever else the machine does hits both alike; the medians over rounds are compared,
and so are the two measurements of each round (the per-round ratio). DDP's process group is set
up inside the job horovodrun started. At the end the two models must hold the same weights: they
took the same steps on the same data.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import horovod.torch as hvd


def make_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "mlp":  # 8 layers, 1024 wide: 6.6 M parameters in 16 tensors
        layers: list[nn.Module] = [nn.Linear(256, 1024), nn.ReLU()]
        for _ in range(6):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(1024, 10))
    if name == "cnn":  # a small VGG-like net on 32x32 images: 0.8 M parameters in 16 tensors
        def block(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU(),
                    nn.MaxPool2d(2)]
        return nn.Sequential(*block(3, 32), *block(32, 64), *block(64, 128), nn.Flatten(),
                             nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, 10))
    if name == "mnist":  # the LeNet-style net of the MNIST examples, 28x28: 22 k parameters in 8 tensors
        return nn.Sequential(nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(10, 20, 5), nn.MaxPool2d(2),
                             nn.ReLU(), nn.Flatten(), nn.Linear(320, 50), nn.ReLU(), nn.Linear(50, 10))
    raise ValueError(f"unknown model {name}")


def batch(name: str, size: int, rank: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(rank)
    shape = {"mlp": (size, 256), "cnn": (size, 3, 32, 32), "mnist": (size, 1, 28, 28)}[name]
    x = torch.randn(shape, generator=generator)
    return x.to(device), torch.randint(0, 10, (size,), generator=generator).to(device)


def synchronized(device: str) -> None:
    """Wait for the device's queued work, so that a step's time is the step's."""
    if device == "cuda":
        torch.cuda.synchronize()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "cnn", "mnist"], default="mlp")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--steps", type=int, default=10, help="steps per round and framework")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3, help="steps of each before timing")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--ddp-backend", choices=["gloo", "nccl"], help="default: nccl on cuda, else gloo")
    parser.add_argument("--json", metavar="PATH", help="rank 0 also writes the rates here (benchmarks/scaling.py)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.device == "cuda":
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    backend = args.ddp_backend or ("nccl" if args.device == "cuda" else "gloo")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0))
    dist.init_process_group(backend, rank=rank, world_size=size)

    base = make_model(args.model)
    ours_model, ddp_model = copy.deepcopy(base).to(args.device), copy.deepcopy(base).to(args.device)
    ddp_model = nn.parallel.DistributedDataParallel(ddp_model)
    ours = hvd.DistributedOptimizer(torch.optim.SGD(ours_model.parameters(), lr=0.01, momentum=0.9),
                                    named_parameters=ours_model.named_parameters())
    theirs = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
    x, y = batch(args.model, args.batch_size, rank, args.device)

    def run(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> float:
        dist.barrier()  # both ranks start together
        start = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        synchronized(args.device)
        return steps / (time.perf_counter() - start)

    run(ours_model, ours, args.warmup)
    run(ddp_model, theirs, args.warmup)
    rates: dict[str, list[float]] = {"khorovod": [], "ddp": []}
    contenders = {"khorovod": (ours_model, ours), "ddp": (ddp_model, theirs)}
    for i in range(args.rounds):
        for name in sorted(contenders, reverse=i % 2 == 1):  # who goes first alternates
            rates[name].append(run(*contenders[name], args.steps))

    drift = max((a - b).abs().max().item() for a, b in zip(ours_model.parameters(), ddp_model.module.parameters()))
    if rank == 0:
        params = sum(p.numel() for p in base.parameters())
        print(f"model {args.model} ({params / 1e6:.1f} M parameters, {len(list(base.parameters()))} tensors), "
              f"batch {args.batch_size} per rank, {size} ranks, {args.threads} thread(s) per rank on {args.device}, "
              f"DDP over {backend}, "
              f"{args.rounds} rounds of {args.steps} steps")
        medians = {k: statistics.median(v) for k, v in rates.items()}
        for k, v in rates.items():
            print(f"{k:9s} {medians[k]:7.2f} steps/s  (rounds: {' '.join(f'{r:.2f}' for r in v)})")
        paired = statistics.median(a / b for a, b in zip(rates["khorovod"], rates["ddp"]))
        print(f"ratio khorovod / DDP: {medians['khorovod'] / medians['ddp']:.3f} of the medians, "
              f"{paired:.3f} median of the per-round ratios")
        print(f"largest weight difference after training: {drift:.2e}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": args.model, "ranks": size, "batch": args.batch_size, "threads": args.threads,
                           "device": args.device, "rates": rates, "drift": drift}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
