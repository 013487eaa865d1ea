"""Where a small allreduce's time goes, part by part, on whichever transport the job uses.

    horovodrun -np 2 python benchmarks/op_parts.py --sizes 4,4K --iters 3000
    horovodrun -np 4 python benchmarks/op_parts.py --sizes 4K --iters 1000

Back-to-back in-place `hvd.allreduce_` (Sum) on a CPU tensor, as a training loop calls it, twice
per size: first untimed inside (the op's own time, median of the slowest rank), then with timers
wrapped around the methods of each part of the path (their own cost is in the second figure
only; a part's figure is its median over the ops). The parts nest, outermost last: the transport's negotiation exchange and its allreduce,
the executor (around the allreduce), the cycle (around the exchange and the executor), the
driver (a waiting thread running cycles, `Driver.drive_until`). What is outside the driver is
the framework side: the torch bridge, naming and checking the op, the request, the handle. It
also counts the negotiation cycles per op on each thread of each rank: more than one per op are
cycles with nothing ready (a peer started one before this rank had submitted).
`benchmarks/mpi_overhead.py` uses the same timers on the MPI path, beside raw MPI.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import threading
import time
from typing import Any

import torch

import horovod.torch as hvd
from horovod.benchmarks.__main__ import parse_sizes
from horovod.common import runtime
from horovod.common.engine.cycle import Cycle
from horovod.common.engine.driver import Driver
from horovod.common.engine.executor import Executor

# The parts after the transport's two, innermost first: (label, class, method).
ENGINE_PARTS = (("executor", Executor, "execute"), ("cycle", Cycle, "run"), ("driver", Driver, "drive_until"))
LABELS = ("negotiation exchange", "transport allreduce") + tuple(label for label, _, _ in ENGINE_PARTS)


def time_parts(spent: collections.Counter, cycles: collections.Counter) -> None:
    """Wrap the parts' methods (the transport's: the class of the one in use) so that each call
    adds its nanoseconds to `spent[label]`, and count the cycles per thread in `cycles`."""
    transport = type(runtime.current().transport)
    parts = (("negotiation exchange", transport, "exchange"), ("transport allreduce", transport, "allreduce_scaled"),
             *ENGINE_PARTS)
    for label, cls, method in parts:
        inner = getattr(cls, method)

        def wrapper(*args: Any, _inner: Any = inner, _label: str = label, _cycle: bool = cls is Cycle,
                    **kwargs: Any) -> Any:
            if _cycle:
                cycles[threading.current_thread().name] += 1
            start = time.perf_counter_ns()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent[_label] += time.perf_counter_ns() - start

        setattr(cls, method, wrapper)


def describe(per_op: dict[str, float], per_rank: list[dict[str, int]], iters: int) -> str:
    """The parts of an op (rank 0), and the cycles per op of each thread of each rank."""
    return ("rank 0 per op, nested: " + ", ".join(f"{label} {us:.1f} us" for label, us in per_op.items())
            + "\n  cycles per op: " + "; ".join(
                ", ".join(f"{thread} {count / iters:.2f}" for thread, count in sorted(rank.items()))
                for rank in per_rank))


def back_to_back(tensor: torch.Tensor, name: str, iters: int, spent: collections.Counter | None = None,
                 series: dict[str, list[float]] | None = None) -> list[float]:
    """Each op's time; with `series`, each op's time in each part too (taken from `spent`)."""
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        hvd.allreduce_(tensor, op=hvd.Sum, name=name)
        times.append(time.perf_counter() - start)
        if series is not None and spent is not None:
            for label in LABELS:
                series[label].append(spent[label] / 1e3)
            spent.clear()
    return times


def slowest_median(times: list[float]) -> float:
    """The median over iterations of the slowest rank's time (allgathered through the job)."""
    every = hvd.allgather_object(times, name="op_parts.times")
    return statistics.median(max(column) for column in zip(*every))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,4K", help="a list, as for python -m horovod.benchmarks")
    parser.add_argument("--iters", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    spent: collections.Counter = collections.Counter()
    cycles: collections.Counter = collections.Counter()
    plain = {}
    for nbytes in parse_sizes(args.sizes):  # untimed inside first, before any method is wrapped
        tensor = torch.zeros(max(nbytes // 4, 1))
        back_to_back(tensor, f"parts.{nbytes}", 50)
        plain[nbytes] = slowest_median(back_to_back(tensor, f"parts.{nbytes}", args.iters))
    time_parts(spent, cycles)
    for nbytes in parse_sizes(args.sizes):
        tensor = torch.zeros(max(nbytes // 4, 1))
        back_to_back(tensor, f"parts.{nbytes}", 50)
        spent.clear()
        cycles.clear()
        series: dict[str, list[float]] = {label: [] for label in LABELS}
        timed = slowest_median(back_to_back(tensor, f"parts.{nbytes}", args.iters, spent, series))
        per_op = {label: statistics.median(values) for label, values in series.items()}
        per_rank = hvd.allgather_object(dict(cycles), name="op_parts.cycles")
        if hvd.rank() == 0:
            transport = runtime.current().transport.name
            print(f"{nbytes} bytes, {hvd.size()} ranks, {transport}: hvd.allreduce_ {plain[nbytes] * 1e6:.1f} us "
                  f"back to back ({timed * 1e6:.1f} us with the timers); " + describe(per_op, per_rank, args.iters),
                  flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
