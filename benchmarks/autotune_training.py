"""Autotune against hand-picked settings, on a deep narrow MLP with many small tensors (khorovod only).

    python benchmarks/autotune_training.py --np 2 --measure 100 --repeat 5

The model has many small parameter tensors (`--layers` Linear layers of `--width`: two tensors
each), and every job runs with HOROVOD_TORCH_OVERLAP_BACKWARD=1, so each gradient is submitted
from its hook during backward, where the engine fuses it only with those that queue while others
are in flight (a lone op starts at once; the cycle time bounds how long queued ones wait).
`--hosts localhost:1,127.0.0.1:1` puts the two ranks on two host names, so they talk over TCP.

Starts one horovodrun job per configuration, in turns (`--repeat` times): deliberately bad
settings (a 64 KiB fusion threshold and a 90 ms cycle; the same with the response cache off),
the defaults, a few hand-picked ones, and autotune. A knob the user sets is never tuned (as in
Horovod), so the autotune job cannot be given the bad values to start from: it starts from the
defaults, and its search includes the bad region (thresholds near 0, cycles up to 100 ms, the
cache off); the configurations it scored are printed from its log. Each job trains the same
model on the same batches with hvd.DistributedOptimizer and reports the steps per second of its
last `--measure` steps; the autotune job first trains until the tuner has finished (and says how
many steps that took), then measures with what it chose. The table gives, per configuration,
min / median / max over repeats and the median's ratio to the best hand-picked median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CONFIGS: dict[str, dict[str, str]] = {
    "bad: 64 KiB, 90 ms": {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024), "HOROVOD_CYCLE_TIME": "90"},
    "bad, no cache: 64 KiB, 90 ms, cache off": {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024), "HOROVOD_CYCLE_TIME": "90",
                                                "HOROVOD_CACHE_CAPACITY": "0"},
    "default: 128 MiB, 1 ms": {"HOROVOD_FUSION_THRESHOLD": str(128 << 20), "HOROVOD_CYCLE_TIME": "1"},
    "32 MiB, 5 ms": {"HOROVOD_FUSION_THRESHOLD": str(32 << 20), "HOROVOD_CYCLE_TIME": "5"},
    "4 MiB, 2 ms": {"HOROVOD_FUSION_THRESHOLD": str(4 << 20), "HOROVOD_CYCLE_TIME": "2"},
    "1 MiB, 1 ms": {"HOROVOD_FUSION_THRESHOLD": str(1 << 20), "HOROVOD_CYCLE_TIME": "1"},
}
# Every job: each gradient submitted from its hook during backward (see the module docstring).
COMMON_ENV = {"HOROVOD_TORCH_OVERLAP_BACKWARD": "1"}


def make_model(layers: int, width: int) -> "torch.nn.Module":
    """`layers` Linear layers of `width` (ReLU between them): 2 * layers small parameter tensors."""
    import torch.nn as nn

    torch_layers: list[nn.Module] = []
    for _ in range(layers - 1):
        torch_layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*torch_layers, nn.Linear(width, 10))


def worker(args: argparse.Namespace) -> None:
    """One job's training loop (run under horovodrun)."""
    import torch
    import torch.nn.functional as F

    import horovod.torch as hvd
    from horovod.common import basics

    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)
    model = make_model(args.layers, args.width)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    generator = torch.Generator().manual_seed(hvd.rank())
    x, y = torch.randn(64, args.width, generator=generator), torch.randint(0, 10, (64,), generator=generator)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    cycle = basics.runtime().engine.cycle

    def tuning() -> bool:  # agreed by all ranks (each reads it between its own steps)
        return bool(hvd.allreduce(torch.tensor([float(cycle.autotuner is not None)]), op=hvd.Max, name="tuning") > 0)

    tuning_steps, started = 0, time.perf_counter()
    while tuning() and tuning_steps < args.max_tuning_steps:
        step()
        tuning_steps += 1
    tuning_seconds = time.perf_counter() - started
    for _ in range(3):
        step()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(args.measure):
        step()
    rate = args.measure / (time.perf_counter() - start)
    if hvd.rank() == 0:
        t = cycle.tunables
        print("RESULT " + json.dumps({"rate": rate, "tuning_steps": tuning_steps, "tuning_seconds": tuning_seconds,
                                      "tuned": cycle.autotuner is None, "fusion": t.fusion_threshold,
                                      "cycle_ms": t.cycle_time_ms, "cache": t.cache_enabled}), flush=True)


def job(env: dict[str, str], args: argparse.Namespace, autotune: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "autotune.csv")
        extra = ["--autotune", "--autotune-log-file", log, "--autotune-warmup-samples", "1",
                 "--autotune-steps-per-sample", str(args.steps_per_sample),
                 "--autotune-bayes-opt-max-samples", str(args.bayes_samples)] if autotune else []
        hosts = ["-H", args.hosts] if args.hosts else []
        cmd = [sys.executable, "-m", "horovod.runner.launch", "-np", str(args.np), *hosts, *extra, sys.executable,
               os.path.abspath(__file__), "--worker", "--measure", str(args.measure), "--layers", str(args.layers),
               "--width", str(args.width)]
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
        child_env.update(COMMON_ENV)
        child_env.update(env)
        out = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=1200)
        for line in out.stdout.splitlines():
            if "RESULT " in line:
                result = json.loads(line.split("RESULT ", 1)[1])
                if autotune:
                    with open(log) as f:
                        result["scored"] = f.read().splitlines()[1:-1]  # without the header and the choice
                return result
    raise RuntimeError(f"job failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--hosts",
                        help="horovodrun -H, e.g. localhost:1,127.0.0.1:1 (two host names: TCP between them)")
    parser.add_argument("--layers", type=int, default=40, help="Linear layers of the MLP")
    parser.add_argument("--width", type=int, default=128, help="their width")
    parser.add_argument("--measure", type=int, default=60, help="steps timed per job")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--steps-per-sample", type=int, default=2)
    parser.add_argument("--bayes-samples", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-tuning-steps", type=int, default=2000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    rates: dict[str, list[float]] = {name: [] for name in [*CONFIGS, "autotune"]}
    tuned: list[dict] = []
    loads = [os.getloadavg()[0]]
    for _ in range(args.repeat):
        for name, env in CONFIGS.items():
            rates[name].append(job(env, args, autotune=False)["rate"])
        result = job({}, args, autotune=True)
        rates["autotune"].append(result["rate"])
        tuned.append(result)
        loads.append(os.getloadavg()[0])
    medians = {name: statistics.median(r) for name, r in rates.items()}
    best = max(v for k, v in medians.items() if not k.startswith(("bad", "autotune")))
    print(f"{args.np} ranks, MLP of {args.layers} layers x {args.width} ({2 * args.layers} tensors), batch 64 per "
          f"rank, HOROVOD_TORCH_OVERLAP_BACKWARD=1, {args.measure} steps timed per job, {args.repeat} repeat(s), "
          f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    print("| configuration | steps/s min | median | max | median vs best hand-picked |\n|---|---:|---:|---:|---:|")
    for name, values in rates.items():
        print(f"| {name} | {min(values):.2f} | {medians[name]:.2f} | {max(values):.2f} | {medians[name] / best:.2f}x |")
    for result in tuned:
        scored = [row.split(",") for row in result["scored"]]
        print(f"autotune chose fusion {result['fusion'] / 2**20:.2f} MiB, cycle {result['cycle_ms']:.1f} ms, "
              f"cache {'on' if result['cache'] else 'off'} after {result['tuning_steps']} steps "
              f"({result['tuning_seconds']:.0f} s; finished: {result['tuned']}); it scored (MiB/ms/cache/hierarchical "
              "allreduce,allgather: bytes per us) " + ", ".join(
                  f"{int(r[5]) / 2**20:.2f}/{float(r[4]):.0f}/{r[3]}/{r[0]}{r[1]}: {float(r[6]):.0f}" for r in scored))


if __name__ == "__main__":
    main()
