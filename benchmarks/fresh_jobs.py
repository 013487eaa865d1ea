"""Does the speed hold from one job to the next? N fresh jobs, the spread of their medians.

    python benchmarks/fresh_jobs.py --jobs 20                  # 2 ranks, 64 MiB and 4 KiB allreduce
    python benchmarks/fresh_jobs.py --jobs 20 --np 4 --sizes 4K,64M
    python benchmarks/fresh_jobs.py --jobs 10 --variant bound= --variant unbound=HOROVOD_CPU_BINDING=0

Each job is a fresh `horovodrun` (new processes, new shared-memory segments, new connections)
running `horovod.benchmarks.worker`: one checked allreduce, warm-up, then `--iters` timed
in-place allreduces per size, each timed as the slowest rank's. A job's figure is its median;
the report is min / median / max over the jobs of those medians (busbw for bandwidth, time for
latency), and how far the slowest job is from the median job. Single-job benchmarks hide a
bimodal machine; this is the one that shows it. With `--variant NAME=VAR=VALUE,...` (repeated)
the jobs of the variants alternate, so that a shared machine's load hits them alike (a variant
may set PYTHONPATH to compare two checkouts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from horovod.benchmarks.__main__ import parse_sizes


def one_job(np_: int, sizes: list[int], iters: int, env: dict[str, str]) -> dict[int, float]:
    """Median seconds per allreduce, per size, of one fresh job."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "horovod.runner.launch", "-np", str(np_), sys.executable, "-m",
               "horovod.benchmarks.worker", "--system", "khorovod", "--ops", "allreduce",
               "--sizes", ",".join(map(str, sizes)), "--seconds", "0", "--min-iters", str(iters),
               "--max-iters", str(iters), "--warmup", "5", "--out", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"job failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        rows = json.loads(out.read_text())["ops"]["allreduce"]
    return {row["bytes"]: row["median_s"] for row in rows}


def spread(values: list[float]) -> tuple[float, float, float]:
    return min(values), statistics.median(values), max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--sizes", default="4K,64M")
    parser.add_argument("--iters", type=int, default=30, help="timed allreduces per size and job")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE,...",
                        help="a variant of the job's environment; the variants' jobs alternate")
    args = parser.parse_args()
    sizes = parse_sizes(args.sizes)
    variants = dict(parse_variant(v) for v in args.variant) or {"khorovod": {}}
    per_job: dict[str, list[dict[int, float]]] = {name: [] for name in variants}
    load = [os.getloadavg()[0]]
    for i in range(args.jobs):
        for name, env in (list(variants.items()) if i % 2 == 0 else reversed(variants.items())):
            per_job[name].append(one_job(args.np, sizes, args.iters, env))
    load.append(os.getloadavg()[0])
    print(f"{args.jobs} fresh jobs per variant, {args.np} ranks, {args.iters} timed allreduces per size and job, "
          f"load average {load[0]:.1f} -> {load[1]:.1f}")
    for name, jobs in per_job.items():
        report(name, jobs, sizes, 2 * (args.np - 1) / args.np)


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assignments = text.partition("=")
    env = dict(a.split("=", 1) for a in assignments.split(",") if a)
    return name, env


def report(name: str, per_job: list[dict[int, float]], sizes: list[int], factor: float) -> None:
    print(f"\n{name}:\n| size | per-job medians: min / median / max | slowest job vs median job |\n|---:|---:|---:|")
    for size in sizes:
        times = [job[size] for job in per_job]
        if size >= 1 << 20:
            low, mid, high = spread([size / t * factor / 1e9 for t in times])
            print(f"| {size >> 20} MiB | {low:.2f} / {mid:.2f} / {high:.2f} GB/s busbw | {low / mid:.2f}x |")
        else:
            low, mid, high = spread([t * 1e6 for t in times])
            print(f"| {size >> 10} KiB | {low:.0f} / {mid:.0f} / {high:.0f} us | {mid / high:.2f}x |")
    print("per job (size: median):")
    for i, job in enumerate(per_job):
        print(f"  job {i:2d}: " + ", ".join(f"{s}: {t * 1e6:.0f} us" for s, t in job.items()))


if __name__ == "__main__":
    main()
