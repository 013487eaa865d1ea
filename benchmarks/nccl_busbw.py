"""Allreduce bandwidth on the GPU: khorovod's NCCL path against torch.distributed's NCCL.

    horovodrun -np 2 python benchmarks/nccl_busbw.py
    horovodrun -np 2 python benchmarks/nccl_busbw.py --sizes 16M,256M --rounds 5

Both run in the same job, on the same ranks, GPUs, NCCL library and environment: every rank
times `iters` in-place float32 Sum allreduces of one size with each (`hvd.allreduce_` and
`dist.all_reduce`), the two alternating in rounds, and waits for the GPU at the end of each
batch. Bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n. Rank 0
prints, per size, the medians over rounds and their ratio (khorovod / torch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import horovod.torch as hvd
from torch_training import free_port  # this folder's: the script's own directory is on sys.path

SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    return int(text[:-1]) * SUFFIX[text[-1]] if text[-1] in SUFFIX else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4K,64K,1M,4M,16M,64M,256M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.2, help="about how long one batch of ops runs")
    parser.add_argument("--json", metavar="PATH", help="rank 0 also writes the results here")
    args = parser.parse_args()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(hvd.broadcast_object(free_port() if rank == 0 else None, root_rank=0))
    dist.init_process_group("nccl", rank=rank, world_size=size,
                            device_id=torch.device("cuda", torch.cuda.current_device()))

    def batch(op, x: torch.Tensor, iters: int) -> float:
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            op(x)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / iters

    contenders = {"khorovod": lambda x: hvd.allreduce_(x, op=hvd.Sum, name="busbw"),
                  "torch": lambda x: dist.all_reduce(x)}
    results = []
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        x = torch.ones(nbytes // 4, device="cuda")
        for op in contenders.values():  # warm up: communicators, caches, the first kernels
            batch(op, x, 3)
        probe = batch(contenders["torch"], x, 3)
        iters = int(hvd.broadcast_object(max(3, min(2000, int(args.seconds / max(probe, 1e-6)))), root_rank=0))
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for i in range(args.rounds):
            for name in sorted(contenders, reverse=i % 2 == 1):
                times[name].append(batch(contenders[name], x, iters))
        if not torch.all(x == x.flatten()[0]).item():
            raise SystemExit(f"allreduce of {nbytes} bytes left unequal elements")
        med = {name: statistics.median(t) for name, t in times.items()}
        busbw = {name: nbytes / t * 2 * (size - 1) / size / 1e9 for name, t in med.items()}
        results.append({"bytes": nbytes, "iters": iters, "seconds": times, "busbw_gbps": busbw})
        if rank == 0:
            print(f"{nbytes:>11d} B  khorovod {busbw['khorovod']:8.2f} GB/s ({med['khorovod'] * 1e6:9.1f} us)  "
                  f"torch {busbw['torch']:8.2f} GB/s ({med['torch'] * 1e6:9.1f} us)  "
                  f"ratio {busbw['khorovod'] / busbw['torch']:.3f}  [{iters} ops x {args.rounds} rounds]", flush=True)
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": size, "results": results}, f)
    dist.destroy_process_group()
    hvd.shutdown()


if __name__ == "__main__":
    main()
