"""Autotune against hand-picked settings, on the training benchmark's MLP (khorovod only).

    python benchmarks/autotune_training.py --np 2 --measure 100 --repeat 2

Starts one horovodrun job per configuration, in turns (`--repeat` times): deliberately bad
settings (a 64 KiB fusion threshold and a 90 ms cycle), a few hand-picked ones, and autotune.
Each job trains the same model on the same batches with hvd.DistributedOptimizer and reports
the steps per second of its last `--measure` steps; the autotune job first trains until the
tuner has finished (and says how many steps that took), then measures with what it chose. The
table gives, per configuration, the median over repeats and its ratio to the best hand-picked.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS: dict[str, dict[str, str]] = {
    "bad: 64 KiB, 90 ms": {"HOROVOD_FUSION_THRESHOLD": str(64 * 1024), "HOROVOD_CYCLE_TIME": "90"},
    "default: 128 MiB, 1 ms": {"HOROVOD_FUSION_THRESHOLD": str(128 << 20), "HOROVOD_CYCLE_TIME": "1"},
    "32 MiB, 5 ms": {"HOROVOD_FUSION_THRESHOLD": str(32 << 20), "HOROVOD_CYCLE_TIME": "5"},
    "4 MiB, 2 ms": {"HOROVOD_FUSION_THRESHOLD": str(4 << 20), "HOROVOD_CYCLE_TIME": "2"},
}


def worker(measure: int, max_tuning_steps: int) -> None:
    """One job's training loop (run under horovodrun)."""
    import torch
    import torch.nn.functional as F

    import horovod.torch as hvd
    from horovod.common import basics

    torch.set_num_threads(1)
    hvd.init()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_training import batch, make_model

    model = make_model("mlp")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    x, y = batch("mlp", 64, hvd.rank())

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    cycle = basics.runtime().engine.cycle

    def tuning() -> bool:  # agreed by all ranks (each reads it between its own steps)
        return bool(hvd.allreduce(torch.tensor([float(cycle.autotuner is not None)]), op=hvd.Max, name="tuning") > 0)

    tuning_steps, started = 0, time.perf_counter()
    while tuning() and tuning_steps < max_tuning_steps:
        step()
        tuning_steps += 1
    tuning_seconds = time.perf_counter() - started
    for _ in range(3):
        step()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(measure):
        step()
    rate = measure / (time.perf_counter() - start)
    if hvd.rank() == 0:
        t = cycle.tunables
        print("RESULT " + json.dumps({"rate": rate, "tuning_steps": tuning_steps, "tuning_seconds": tuning_seconds,
                                      "tuned": cycle.autotuner is None, "fusion": t.fusion_threshold,
                                      "cycle_ms": t.cycle_time_ms, "cache": t.cache_enabled}), flush=True)


def job(np_: int, env: dict[str, str], args: argparse.Namespace, autotune: bool) -> dict:
    extra = ["--autotune", "--autotune-warmup-samples", "1", "--autotune-steps-per-sample", str(args.steps_per_sample),
             "--autotune-bayes-opt-max-samples", str(args.bayes_samples)] if autotune else []
    cmd = [sys.executable, "-m", "horovod.runner.launch", "-np", str(np_), *extra, sys.executable,
           os.path.abspath(__file__), "--worker", "--measure", str(args.measure)]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    child_env.update(env)
    out = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=1200)
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise RuntimeError(f"job failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--measure", type=int, default=100, help="steps timed per job")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--steps-per-sample", type=int, default=2)
    parser.add_argument("--bayes-samples", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-tuning-steps", type=int, default=2000, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.measure, args.max_tuning_steps)
        return
    rates: dict[str, list[float]] = {name: [] for name in [*CONFIGS, "autotune"]}
    tuned: list[dict] = []
    for _ in range(args.repeat):
        for name, env in CONFIGS.items():
            rates[name].append(job(args.np, env, args, autotune=False)["rate"])
        result = job(args.np, {}, args, autotune=True)
        rates["autotune"].append(result["rate"])
        tuned.append(result)
    load = os.getloadavg()[0]
    medians = {name: statistics.median(r) for name, r in rates.items()}
    best = max(v for k, v in medians.items() if not k.startswith(("bad", "autotune")))
    print(f"{args.np} ranks, MLP batch 64 per rank, {args.measure} steps timed per job, {args.repeat} repeat(s), "
          f"load average {load:.1f}")
    print("| configuration | steps/s (median) | vs best hand-picked |\n|---|---:|---:|")
    for name, value in medians.items():
        print(f"| {name} | {value:.2f} | {value / best:.2f}x |")
    for result in tuned:
        print(f"autotune chose fusion {result['fusion'] / 2**20:.1f} MiB, cycle {result['cycle_ms']:.1f} ms, "
              f"cache {'on' if result['cache'] else 'off'} after {result['tuning_steps']} steps "
              f"({result['tuning_seconds']:.0f} s; finished: {result['tuned']})")


if __name__ == "__main__":
    main()
