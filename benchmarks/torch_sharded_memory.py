"""Optimizer state per rank: ShardedDistributedOptimizer against DistributedOptimizer.

    horovodrun -np 4 python benchmarks/torch_sharded_memory.py
    horovodrun -np 2 python benchmarks/torch_sharded_memory.py --width 2048 --optimizer sgd

The same MLP (8 layers of `--width`), the same optimizer, a few steps each way; rank 0 prints,
for every rank, the bytes of optimizer state the rank holds (the tensors of `opt.state`) and the
largest resident set the process reached, and checks that both runs end with the same weights.
"""

from __future__ import annotations

import argparse
import json
import resource

import torch

import horovod.torch as hvd


def make_model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = [m for _ in range(8) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def train(wrap, args: argparse.Namespace) -> tuple[torch.nn.Module, int]:
    model = make_model(args.width)
    inner = (torch.optim.Adam(model.parameters(), lr=1e-4) if args.optimizer == "adam"
             else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    optimizer = wrap(inner, named_parameters=model.named_parameters())
    torch.manual_seed(1 + hvd.rank())
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, args.width)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    return model, state_bytes(optimizer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    sharded, sharded_bytes = train(hvd.ShardedDistributedOptimizer, args)
    sharded_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    plain, plain_bytes = train(hvd.DistributedOptimizer, args)
    plain_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # peak so far: both runs
    diff = max((a - b).abs().max().item() for a, b in zip(sharded.parameters(), plain.parameters()))
    rows = hvd.allgather_object({"rank": hvd.rank(), "sharded_state_bytes": sharded_bytes,
                                 "unsharded_state_bytes": plain_bytes, "peak_rss_sharded_run": sharded_rss,
                                 "peak_rss_after_both": plain_rss, "max_weight_difference": diff})
    if hvd.rank() == 0:
        params = sum(p.numel() for p in sharded.parameters())
        print(json.dumps({"ranks": hvd.size(), "parameters": params, "optimizer": args.optimizer,
                          "per_rank": rows}, indent=1))


if __name__ == "__main__":
    main()
