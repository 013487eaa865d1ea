"""Packed or one by one: where fusing allreduces stops paying (`fusion.PACK_BELOW_BYTES`).

    horovodrun -np 2 python benchmarks/fusion_cutoff.py
    HOROVOD_CPU_OPERATIONS=tcp horovodrun -np 2 python benchmarks/fusion_cutoff.py

Fusing copies each tensor into the fusion buffer and back out: two passes over its bytes, paid
to save the tensor a transport call of its own. This times a grouped allreduce of 8 equal
tensors per size both ways in one job, in turns of 20 calls: every tensor packed (the cutoff
lifted), and every tensor alone (the cutoff at 0). Times are rank 0's medians; the ratio is
packed over alone (below 1: packing pays).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import horovod.numpy as hvd
from horovod.benchmarks.__main__ import parse_sizes
from horovod.common.engine import fusion

VARIANTS = {"packed": 1 << 62, "alone": 0}  # the cutoff each runs with
BLOCK = 20  # calls in a row per variant before the other's turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16K,64K,256K,1M,4M", help="bytes per tensor (K and M suffixes)")
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--iters", type=int, default=200, help="timed calls per variant and size")
    args = parser.parse_args()
    hvd.init()
    if hvd.rank() == 0:
        print(f"{hvd.size()} ranks, {args.tensors} float32 tensors per grouped allreduce, "
              f"rank 0's median over {args.iters} calls (variants in turns of {BLOCK})")
        print(f"{'tensor':>8} {'packed us':>10} {'alone us':>10} {'packed/alone':>13}")
    for size in parse_sizes(args.sizes):
        tensors = [np.ones(size // 4, np.float32) for _ in range(args.tensors)]
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.iters // BLOCK):
            for name, cutoff in VARIANTS.items():
                fusion.PACK_BELOW_BYTES = cutoff
                for i in range(BLOCK + 2):
                    start = time.perf_counter()
                    hvd.grouped_allreduce(tensors, op=hvd.Sum, name=f"t{size}")
                    if i >= 2:  # the first calls after a switch settle the caches
                        times[name].append(time.perf_counter() - start)
        if hvd.rank() == 0:
            packed, alone = (statistics.median(times[name]) * 1e6 for name in VARIANTS)
            print(f"{size // 1024:>7}K {packed:>10.0f} {alone:>10.0f} {packed / alone:>13.2f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
