"""Does the speed hold from one job to the next? N fresh jobs, the spread of their medians.

    python benchmarks/fresh_jobs.py --jobs 20                  # 2 ranks, 64 MiB and 4 KiB allreduce
    python benchmarks/fresh_jobs.py --jobs 20 --np 4 --sizes 4K,64M
    python benchmarks/fresh_jobs.py --jobs 10 --variant bound= --variant unbound=HOROVOD_CPU_BINDING=0
    python benchmarks/fresh_jobs.py --jobs 10 --sizes 64M --systems khorovod,gloo --busy 1

Each job is a fresh `horovodrun` (new processes, new shared-memory segments, new connections)
running `horovod.benchmarks.worker`: one checked allreduce, warm-up, then `--iters` timed
in-place allreduces per size, each timed as the slowest rank's. A job's figure is its median;
the report is min / median / max over the jobs of those medians (busbw for bandwidth, time for
latency), and how far the slowest job is from the median job. Each job's line also says how many
cores the rest of the machine kept busy while it ran (from /proc/stat, less the job's own CPU
time), how many the host of a virtual machine took (steal), the memory bandwidth of one core
just before (a 64 MiB copy), and how much slower Python ran on the first two cores at once than
on each alone, just before and just after (a host that runs a virtual machine's two cores on
one physical core shows there, and nowhere else), and the round trip of one word bounced between
the first two cores just before (where the host runs the two cores, sharing a cache or not):
a slow job that shared its cores or its memory bus shows there. Single-job benchmarks hide a bimodal machine; this is the one that
shows it. With `--variant NAME=VAR=VALUE,...` (repeated)
the jobs of the variants alternate, so that a shared machine's load hits them alike (a variant
may set PYTHONPATH to compare two checkouts). `--systems khorovod,gloo` runs a peer's jobs in
the same turns; `--busy N` keeps N more processes spinning beside every job, to see how each
system shares the machine with a data loader or another job.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from horovod.benchmarks.__main__ import parse_sizes, run_system

# Keys of a job's conditions beside its sizes (which are positive).
OTHERS, STOLEN, COPY, TOGETHER, ROUND_TRIP, STAGING = -1, -2, -3, -4, -5, -6


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds since boot, all cores: busy (every process), and stolen (a virtual machine's
    cores waiting for the host's)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks[:7]) - ticks[3] - ticks[4]) / hz, ticks[7] / hz  # busy: less idle, iowait, steal


def copy_gbps() -> float:
    """This machine's memory bandwidth right now: the best of a few 64 MiB copies, one core."""
    src, dst = np.ones(1 << 24, np.float32), np.empty(1 << 24, np.float32)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
    return src.nbytes / best / 1e9


def python_loop_seconds(rounds: int = 5, n: int = 200_000) -> float:
    """The median time of a pure-Python loop (what a small op's time mostly is)."""
    def loop() -> None:
        total = 0
        for i in range(n):
            total += i
    return statistics.median(_timed(loop) for _ in range(rounds))


def _loops_on(cores: list[int]) -> list[float]:
    """`python_loop_seconds` on each of `cores` at the same time, one forked process per core."""
    go_r, go_w = os.pipe()
    children = []
    for core in cores:
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: pinned, waits for the start, reports its time
            try:
                os.sched_setaffinity(0, {core})
                os.read(go_r, 1)
                os.write(out_w, repr(python_loop_seconds()).encode())
            finally:
                os._exit(0)
        os.close(out_w)
        children.append((pid, out_r))
    os.write(go_w, b"x" * len(cores))
    times = []
    for pid, out_r in children:
        with os.fdopen(out_r) as f:
            times.append(float(f.read()))
        os.waitpid(pid, 0)
    os.close(go_r)
    os.close(go_w)
    return times


def together_slowdown() -> float:
    """How much slower Python runs on each of the first two cores when both run it at once than
    when each runs alone: 1.0 when they are independent cores; more when the host runs them on
    one physical core (hyperthreads) or shares it, which nothing inside a virtual machine shows."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        return 1.0
    alone = [_loops_on([core])[0] for core in cores]
    together = _loops_on(cores)
    return max(t / a for t, a in zip(together, alone))


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def children_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def core_round_trip_us(trips: int = 20_000) -> float:
    """One word bounced between the first two cores through shared memory, by two pinned
    processes: the cost of a cache line crossing between the cores and back, in microseconds.
    A virtual machine's host decides where its cores run (sharing a cache or not), invisibly from
    inside; this is where that shows."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        return 0.0
    cell = np.frombuffer(mmap.mmap(-1, 64), np.int64)  # shared with the forked child
    pid = os.fork()
    if pid == 0:  # the child answers every odd value with the next even one
        try:
            os.sched_setaffinity(0, {cores[1]})
            for n in range(1, 2 * trips, 2):
                while cell[0] != n:
                    pass
                cell[0] = n + 1
        finally:
            os._exit(0)
    try:
        os.sched_setaffinity(0, {cores[0]})
        start = time.perf_counter()
        for n in range(0, 2 * trips, 2):
            cell[0] = n + 1
            while cell[0] != n + 2:
                pass
        return (time.perf_counter() - start) / trips * 1e6
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        os.waitpid(pid, 0)


def busy_processes(count: int) -> list[subprocess.Popen]:
    """`count` processes that keep a core busy, as a data loader or a second job would."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def one_job(system: str, np_: int, sizes: list[int], iters: int, env: dict[str, str], busy: int) -> dict[int, float | str]:
    """Median seconds per allreduce, per size, of one fresh job of `system`; and what the machine
    was like meanwhile: OTHERS, the cores everything else kept busy (busy time not the job's, over
    the wall time; the busy processes we start count), STOLEN, the cores the host took from this
    machine, COPY, the memory bandwidth just before, TOGETHER, two cores' Python at once against
    alone, ROUND_TRIP, the core-to-core round trip just before."""
    copy, before, trip = copy_gbps(), together_slowdown(), core_round_trip_us()
    args = argparse.Namespace(np=np_, hosts=None, huge_pages="off", mpirun_args="", warmup=5,
                              min_iters=iters, timeout=600)
    saved = dict(os.environ)
    os.environ.update(env)
    hogs = busy_processes(busy)
    start, (busy_s, stolen), ours = time.perf_counter(), cpu_seconds(), children_seconds()
    try:
        result = run_system(system, args, ["allreduce"], sizes, 0.0, iters)
        wall, (busy_end, stolen_end), job_cpu = time.perf_counter() - start, cpu_seconds(), children_seconds() - ours
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        os.environ.clear()
        os.environ.update(saved)
    if "error" in result:
        raise RuntimeError(result["error"])
    others = (busy_end - busy_s - job_cpu) / wall
    return {**{row["bytes"]: row["median_s"] for row in result["ops"]["allreduce"]}, OTHERS: max(others, 0.0),
            STOLEN: (stolen_end - stolen) / wall, COPY: copy, TOGETHER: max(before, together_slowdown()),
            ROUND_TRIP: trip, STAGING: result.get("staging", "")}


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--sizes", default="4K,64M")
    parser.add_argument("--iters", type=int, default=30, help="timed allreduces per size and job")
    parser.add_argument("--systems", default="khorovod",
                        help="comma-separated: khorovod, khorovod:mpi, gloo, mpi (as python -m horovod.benchmarks); "
                             "their jobs alternate")
    parser.add_argument("--busy", type=int, default=0,
                        help="processes that keep a core busy during every job (a data loader, a second job)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE,...",
                        help="a variant of khorovod's environment; the variants' jobs alternate")
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    variants = dict(parse_variant(v) for v in args.variant) or {"": {}}
    runs = [(f"{system} {name}".strip(), system, env) for system in args.systems.split(",")
            for name, env in (variants.items() if system.startswith("khorovod") else [("", {})])]
    per_job: dict[str, list[dict[int, float | str]]] = {label: [] for label, _, _ in runs}
    load = [os.getloadavg()[0]]
    for i in range(args.jobs):
        for label, system, env in (runs if i % 2 == 0 else reversed(runs)):
            per_job[label].append(one_job(system, args.np, sizes, args.iters, env, args.busy))
    load.append(os.getloadavg()[0])
    print(f"{args.jobs} fresh jobs per system, {args.np} ranks, {args.iters} timed allreduces per size and job, "
          f"{args.busy} busy processes beside each job, load average {load[0]:.1f} -> {load[1]:.1f}")
    for label, jobs in per_job.items():
        report(label, jobs, sizes, 2 * (args.np - 1) / args.np)


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition("=")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return name, env


def report(name: str, per_job: list[dict[int, float | str]], sizes: list[int], factor: float) -> None:
    print(f"\n{name}:\n| size | per-job medians: min / median / max | slowest job vs median job |\n|---:|---:|---:|")
    for size in sizes:
        times = [job[size] for job in per_job]
        if size >= 1 << 20:
            low, mid, high = spread([size / t * factor / 1e9 for t in times])
            print(f"| {size >> 20} MiB | {low:.2f} / {mid:.2f} / {high:.2f} GB/s busbw | {low / mid:.2f}x |")
        else:
            low, mid, high = spread([t * 1e6 for t in times])
            print(f"| {size >> 10} KiB | {low:.0f} / {mid:.0f} / {high:.0f} us | {mid / high:.2f}x |")
    print("per job (size: median; cores other processes kept busy and cores stolen by the host during the job; "
          "memory copy GB/s just before; how much slower Python ran on two cores at once than alone, the "
          "worse of just before and just after; a core-to-core round trip just before; how rank 0 staged its "
          "large allreduces at the end, where it applies):")
    for i, job in enumerate(per_job):
        print(f"  job {i:2d}: " + ", ".join(f"{s}: {job[s] * 1e6:.0f} us" for s in sizes)
              + f"; others {job[OTHERS]:.2f} cores, stolen {job[STOLEN]:.2f}, copy {job[COPY]:.1f} GB/s, "
              f"together {job[TOGETHER]:.2f}x, round trip {job[ROUND_TRIP]:.2f} us"
              + (f", staging {job[STAGING]}" if job.get(STAGING) else ""))


if __name__ == "__main__":
    main()
