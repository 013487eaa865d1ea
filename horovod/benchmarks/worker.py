"""One rank of a collective benchmark, for any of the systems we compare.

This file runs as a plain script (`python worker.py ...`) under the launcher of the system it
measures, so it imports nothing of ours unless it measures us: `--system khorovod` and
`--system horovod` run the very same code through `horovod.torch` (ours, or the reference Horovod
installed in another environment), `gloo` runs torch.distributed, `mpi` runs mpi4py.

Every op is timed on its own, back to back; per iteration the time kept is the slowest rank's,
and rank 0 writes the medians and minimums as JSON to `--out`. Before timing, each op is run once
on known data and its result checked, so nothing is fast because it is wrong.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from abc import ABC, abstractmethod

import numpy as np

OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")


class Backend(ABC):
    """What each system provides: rank/size, the five collectives on preallocated buffers, and
    a barrier and an element-wise max of a float64 array (to combine the ranks' timings)."""

    name = ""
    rank = 0
    size = 1
    version = ""

    @abstractmethod
    def buffers(self, op: str, nbytes: int) -> tuple:
        """Preallocated tensors for `op` on `nbytes` (the input first, then any output)."""

    @abstractmethod
    def run(self, op: str, bufs: tuple, tag: str) -> object:
        """One `op` on `bufs`; returns its result."""

    def as_numpy(self, data: object) -> np.ndarray:
        return np.asarray(data)  # numpy arrays and CPU torch tensors alike

    def fill(self, bufs: tuple, value: float) -> None:
        bufs[0][...] = value

    @abstractmethod
    def max_across(self, values: np.ndarray) -> np.ndarray:
        """The element-wise maximum of `values` over all ranks."""

    def barrier(self) -> None:
        self.max_across(np.zeros(1))

    def staging(self) -> str:
        """How this rank staged its last large two-rank allreduce in shared memory ("ring" or
        "slots"; khorovod's `transport/shm/staging.py`), '' where that does not apply."""
        return ""

    def close(self) -> None:
        pass


def _elements(op: str, nbytes: int, size: int) -> tuple[int, int]:
    """(input elements, output elements) of float32 for an op whose total buffer is `nbytes`
    (nccl-tests sizes: the tensor for allreduce and broadcast, the gathered output for allgather,
    the input for reducescatter and alltoall)."""
    total = max(size, nbytes // 4 // size * size)
    if op == "allgather":
        return total // size, total
    if op == "reducescatter":
        return total, total // size
    return total, total


class HorovodApi(Backend):
    """khorovod or the reference Horovod through `horovod.torch` (the same API), or khorovod
    through `horovod.numpy` where torch is not installed; in place where the API allows."""

    def __init__(self, system: str) -> None:
        try:
            import torch
            import horovod.torch as hvd

            torch.set_num_threads(1)
            self.torch: object = torch
        except ImportError:
            if system == "horovod":
                raise
            import horovod.numpy as hvd

            self.torch = None
        hvd.init()
        self.hvd = hvd
        self.name, self.rank, self.size = system, hvd.rank(), hvd.size()
        self.version = getattr(__import__("horovod"), "__version__", "")

    def buffers(self, op: str, nbytes: int) -> tuple:
        n_in, _ = _elements(op, nbytes, self.size)
        if self.torch is None:
            return (np.zeros(n_in, np.float32),)
        return (self.torch.zeros(n_in, dtype=self.torch.float32),)  # type: ignore[attr-defined]

    def run(self, op: str, bufs: tuple, tag: str) -> object:
        hvd, t = self.hvd, bufs[0]
        if op == "allreduce":
            if self.torch is None:
                return hvd.synchronize(hvd.allreduce_async(t, name=tag, op=hvd.Sum, output=t))
            return hvd.allreduce_(t, op=hvd.Sum, name=tag)
        if op == "allgather":
            return hvd.allgather(t, name=tag)
        if op == "broadcast":
            return (hvd.broadcast if self.torch is None else hvd.broadcast_)(t, root_rank=0, name=tag)
        if op == "alltoall":
            return hvd.alltoall(t, name=tag)
        return hvd.reducescatter(t, op=hvd.Sum, name=tag)

    def max_across(self, values: np.ndarray) -> np.ndarray:
        values = np.ascontiguousarray(values, np.float64)
        if self.torch is None:
            return self.hvd.allreduce(values, op=self.hvd.Max, name="bench.times")
        return np.asarray(self.hvd.allreduce(self.torch.from_numpy(values), op=self.hvd.Max,  # type: ignore
                                             name="bench.times"))

    def staging(self) -> str:
        if self.name != "khorovod":
            return ""
        from horovod.common import runtime

        shm = getattr(runtime.current().transport, "shm", None)
        return "" if shm is None else ("ring" if shm.staging.ring else "slots")

    def close(self) -> None:
        self.hvd.shutdown()


class Gloo(Backend):
    """torch.distributed with the gloo backend (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the driver)."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        self.torch, self.dist = torch, dist
        self.name, self.rank, self.size = "gloo", dist.get_rank(), dist.get_world_size()
        self.version = f"torch {torch.__version__}"

    def buffers(self, op: str, nbytes: int) -> tuple:
        n_in, n_out = _elements(op, nbytes, self.size)
        zeros = self.torch.zeros
        if op in ("allreduce", "broadcast"):
            return (zeros(n_in, dtype=self.torch.float32),)
        return zeros(n_in, dtype=self.torch.float32), zeros(n_out, dtype=self.torch.float32)

    def run(self, op: str, bufs: tuple, tag: str) -> object:
        dist = self.dist
        if op == "allreduce":
            dist.all_reduce(bufs[0])
            return bufs[0]
        if op == "broadcast":
            dist.broadcast(bufs[0], 0)
            return bufs[0]
        if op == "allgather":
            dist.all_gather_into_tensor(bufs[1], bufs[0])
        elif op == "alltoall":
            dist.all_to_all_single(bufs[1], bufs[0])
        else:
            dist.reduce_scatter_tensor(bufs[1], bufs[0])
        return bufs[1]

    def max_across(self, values: np.ndarray) -> np.ndarray:
        t = self.torch.from_numpy(np.ascontiguousarray(values, np.float64))
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.numpy()

    def close(self) -> None:
        self.dist.destroy_process_group()


class Mpi(Backend):
    """mpi4py on numpy buffers, in place where MPI allows."""

    def __init__(self) -> None:
        from mpi4py import MPI

        self.mpi, self.comm = MPI, MPI.COMM_WORLD
        self.name, self.rank, self.size = "mpi", self.comm.Get_rank(), self.comm.Get_size()
        self.version = MPI.Get_library_version().splitlines()[0].strip()

    def buffers(self, op: str, nbytes: int) -> tuple:
        n_in, n_out = _elements(op, nbytes, self.size)
        if op in ("allreduce", "broadcast"):
            return (np.zeros(n_in, np.float32),)
        return np.zeros(n_in, np.float32), np.zeros(n_out, np.float32)

    def run(self, op: str, bufs: tuple, tag: str) -> object:
        comm, MPI = self.comm, self.mpi
        if op == "allreduce":
            comm.Allreduce(MPI.IN_PLACE, bufs[0], op=MPI.SUM)
            return bufs[0]
        if op == "broadcast":
            comm.Bcast(bufs[0], root=0)
            return bufs[0]
        if op == "allgather":
            comm.Allgather(bufs[0], bufs[1])
        elif op == "alltoall":
            comm.Alltoall(bufs[0], bufs[1])
        else:
            comm.Reduce_scatter_block(bufs[0], bufs[1], op=MPI.SUM)
        return bufs[1]

    def max_across(self, values: np.ndarray) -> np.ndarray:
        out = np.ascontiguousarray(values, np.float64).copy()
        self.comm.Allreduce(self.mpi.IN_PLACE, out, op=self.mpi.MAX)
        return out


def make_backend(system: str) -> Backend:
    if system in ("khorovod", "horovod"):
        return HorovodApi(system)
    if system == "gloo":
        return Gloo()
    if system == "mpi":
        return Mpi()
    raise ValueError(f"unknown system {system!r}")


def check(backend: Backend, op: str, nbytes: int) -> str:
    """Run `op` once on known data; '' if the result is right, else what is wrong."""
    bufs = backend.buffers(op, nbytes)
    r, n = backend.rank, backend.size
    backend.fill(bufs, float(r + 1))
    out = backend.as_numpy(backend.run(op, bufs, f"check.{op}.{nbytes}"))
    if op == "allreduce":
        want = np.full(out.shape, n * (n + 1) / 2)
    elif op == "broadcast":
        want = np.full(out.shape, 1.0)
    elif op == "allgather":
        want = np.repeat(np.arange(1, n + 1, dtype=np.float64), out.size // n)
    elif op == "alltoall":
        want = np.repeat(np.arange(1, n + 1, dtype=np.float64), out.size // n)
    else:
        want = np.full(out.shape, n * (n + 1) / 2)
    if out.shape != want.shape or not np.array_equal(out, want):
        return f"{op} of {nbytes} bytes: wrong result on rank {r}: {out.ravel()[:4]} ..., want {want.ravel()[:4]} ..."
    return ""


def measure(backend: Backend, op: str, nbytes: int, seconds: float, min_iters: int, max_iters: int,
            warmup: int) -> dict:
    bufs = backend.buffers(op, nbytes)
    backend.fill(bufs, 0.0)
    tag = f"bench.{op}.{nbytes}"
    start = time.perf_counter()
    for _ in range(warmup):
        backend.run(op, bufs, tag)
    per_iter = (time.perf_counter() - start) / max(1, warmup)
    # Every rank must run the same number of iterations: agree on the slowest estimate.
    per_iter = float(backend.max_across(np.array([per_iter]))[0])
    iters = int(min(max_iters, max(min_iters, seconds / max(per_iter, 1e-7))))
    times = np.empty(iters)
    backend.barrier()
    for i in range(iters):
        t0 = time.perf_counter()
        backend.run(op, bufs, tag)
        times[i] = time.perf_counter() - t0
    slowest = backend.max_across(times)
    return {"bytes": nbytes, "iters": iters, "median_s": float(statistics.median(slowest)),
            "min_s": float(slowest.min()), "p90_s": float(np.percentile(slowest, 90))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", required=True, choices=["khorovod", "horovod", "gloo", "mpi"])
    parser.add_argument("--ops", required=True, help="comma-separated: " + ", ".join(OPS))
    parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
    parser.add_argument("--seconds", type=float, default=0.5, help="timing budget per op and size")
    parser.add_argument("--min-iters", type=int, default=5)
    parser.add_argument("--max-iters", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    backend = make_backend(args.system)
    report: dict = {"system": args.system, "version": backend.version, "ranks": backend.size, "ops": {},
                    "errors": []}
    for op in args.ops.split(","):
        rows = []
        for nbytes in (int(s) for s in args.sizes.split(",")):
            try:
                problem = check(backend, op, nbytes)
            except Exception as exc:  # an op this system lacks (gloo has no reduce_scatter, ...)
                problem = f"{op}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                report["errors"].append(problem)
                break
            if problem:
                report["errors"].append(problem)
                break
            rows.append(measure(backend, op, nbytes, args.seconds, args.min_iters, args.max_iters, args.warmup))
        report["ops"][op] = rows
    report["staging"] = backend.staging()
    if backend.rank == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
