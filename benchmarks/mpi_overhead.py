"""Where an allreduce's time goes on the MPI path: one job, raw MPI and ours on the same ranks.

    horovodrun --mpi -np 2 python benchmarks/mpi_overhead.py --sizes 4,1M,16M
    horovodrun --mpi -np 4 python benchmarks/mpi_overhead.py --sizes 1M --iters 300

Fresh jobs started minutes apart differ more than the gap we look for (docs/engineering-notes.md), so
everything here is taken in one job, in turns, iteration by iteration:
- side by side, a barrier before each call: a raw mpi4py `Allreduce` on numpy memory and on the
  torch tensor's memory, the MPI transport's own `allreduce` (Sum; no engine), and
  `hvd.allreduce_(op=Sum)`;
- back to back, as a training step calls it: `hvd.allreduce_` with its time split into the parts
  of the engine (timers wrapped around the public methods of the transport, executor, cycle and
  driver, as `benchmarks/op_parts.py` does on any transport), and how many negotiation cycles
  each op took, on which thread.
Times are the slowest rank's, medians over the iterations (the split: means per op, rank 0).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
from mpi4py import MPI

import horovod.torch as hvd
from horovod.benchmarks.__main__ import parse_sizes
from horovod.common import runtime
from op_parts import LABELS, describe, time_parts  # benchmarks/op_parts.py, beside this script

def slowest_median(comm: Any, times: list[float]) -> float:
    slowest = np.array(times)
    comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
    return statistics.median(slowest)


def side_by_side(comm: Any, nbytes: int, iters: int) -> dict[str, float]:
    transport = runtime.current().transport
    group = list(range(comm.size))
    array = np.zeros(nbytes // 4, np.float32)
    tensor = torch.zeros(nbytes // 4)
    memory = tensor.numpy()
    calls: dict[str, Callable[[], object]] = {
        "raw Allreduce (numpy)": lambda: comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM),
        "raw Allreduce (torch memory)": lambda: comm.Allreduce(MPI.IN_PLACE, memory, op=MPI.SUM),
        "transport.allreduce (Sum)": lambda: transport.allreduce(group, array, hvd.Sum),
        "hvd.allreduce_ (Sum)": lambda: hvd.allreduce_(tensor, op=hvd.Sum, name=f"side.{nbytes}"),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(3):
        for call in calls.values():
            call()
    for _ in range(iters):
        for name, call in calls.items():
            comm.Barrier()
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: slowest_median(comm, t) for name, t in times.items()}


def back_to_back(comm: Any, nbytes: int, iters: int, spent: collections.Counter,
                 cycles: collections.Counter) -> tuple[float, dict[str, float], list[dict[str, int]]]:
    tensor = torch.zeros(nbytes // 4)
    for _ in range(10):
        hvd.allreduce_(tensor, op=hvd.Sum, name=f"b2b.{nbytes}")
    spent.clear()
    cycles.clear()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        hvd.allreduce_(tensor, op=hvd.Sum, name=f"b2b.{nbytes}")
        times.append(time.perf_counter() - start)
    per_op = {label: spent[label] / iters / 1e3 for label in LABELS}
    return slowest_median(comm, times), per_op, comm.allgather(dict(cycles))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,1M,16M", help="a list, as for python -m horovod.benchmarks")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spent: collections.Counter = collections.Counter()
    cycles: collections.Counter = collections.Counter()
    hvd.init()
    time_parts(spent, cycles)
    comm = MPI.COMM_WORLD.Dup()
    for nbytes in parse_sizes(args.sizes):
        side = side_by_side(comm, nbytes, args.iters)
        median, per_op, per_rank = back_to_back(comm, nbytes, args.iters, spent, cycles)
        if comm.rank == 0:
            raw = side["raw Allreduce (numpy)"]
            print(f"{nbytes} bytes, {comm.size} ranks, side by side (barrier before each):")
            for name, seconds in side.items():
                print(f"  {name:30s} {seconds * 1e6:10.1f} us  {seconds / raw:5.2f}x raw")
            print(f"  back to back: hvd.allreduce_ {median * 1e6:.1f} us; " + describe(per_op, per_rank, args.iters),
                  flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
