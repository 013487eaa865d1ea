"""Scaling efficiency of training: throughput of N ranks / (N x the throughput of one rank).

    python benchmarks/scaling.py                                  # mlp and cnn, 1, 2, 4 ranks, two hosts
    python benchmarks/scaling.py --models mlp --repeat 3 --out docs/performance-scaling.png

One rank is plain PyTorch training (khorovod's optimizer does nothing at size 1): both
frameworks' efficiencies are against it. Each configuration is one `horovodrun` job of `benchmarks/torch_training.py`, which trains the
same model on the same batches with khorovod's DistributedOptimizer and with PyTorch DDP (gloo)
in alternating rounds; its median steps/s per framework is taken. Throughput is samples per
second over all ranks (steps/s x batch per rank x ranks), so the batch per rank stays the same
as ranks are added (weak scaling, as data-parallel training is run). "4 ranks, two hosts" runs
`-H localhost:2,127.0.0.1:2`: two host names on this machine, so khorovod takes its hierarchical
path (shared memory inside each pair, TCP between them). With `--repeat N` the configurations
run in turns N times and the medians are kept. Writes a PNG of the efficiencies and prints the
table that docs/performance.md shows.
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

HERE = Path(__file__).resolve().parent
# name -> (ranks, extra horovodrun arguments)
CONFIGS = {
    "1 rank": (1, []),
    "2 ranks": (2, []),
    "4 ranks": (4, []),
    "4 ranks, two hosts": (4, ["-H", "localhost:2,127.0.0.1:2"]),
}
BATCH = {"mlp": 64, "cnn": 32}
FRAMEWORKS = ("khorovod", "ddp")


def one_job(model: str, ranks: int, extra: list[str], rounds: int, steps: int) -> dict[str, float]:
    """Median steps/s of each framework in one job."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rates.json"
        cmd = [sys.executable, "-m", "horovod.runner.launch", "-np", str(ranks), *extra, sys.executable,
               str(HERE / "torch_training.py"), "--model", model, "--batch-size", str(BATCH[model]),
               "--rounds", str(rounds), "--steps", str(steps), "--json", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"job failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        rates = json.loads(out.read_text())["rates"]
    return {name: statistics.median(rates[name]) for name in FRAMEWORKS}


def measure(models: list[str], repeat: int, rounds: int, steps: int) -> dict[str, dict[str, dict[str, float]]]:
    """model -> configuration -> framework -> samples/s over all ranks (median of the repeats)."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = {m: {c: [] for c in CONFIGS} for m in models}
    for _ in range(repeat):
        for model in models:
            for config, (ranks, extra) in CONFIGS.items():
                runs[model][config].append(one_job(model, ranks, extra, rounds, steps))
    return {model: {config: {fw: statistics.median(r[fw] for r in results) * BATCH[model] * CONFIGS[config][0]
                             for fw in FRAMEWORKS}
                    for config, results in by_config.items()}
            for model, by_config in runs.items()}


def efficiency(throughput: dict[str, dict[str, float]], config: str, framework: str) -> float:
    """Against one rank training alone: khorovod's optimizer does nothing at size 1, so its 1-rank
    figure is plain PyTorch (DDP keeps its bucket copies even then, and is not the baseline)."""
    return throughput[config][framework] / (CONFIGS[config][0] * throughput["1 rank"]["khorovod"])


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = ["| model | configuration | khorovod samples/s | DDP samples/s | khorovod / DDP | "
             "efficiency khorovod | efficiency DDP |", "|---|---|---:|---:|---:|---:|---:|"]
    for model, throughput in results.items():
        for config, by_fw in throughput.items():
            lines.append(f"| {model} | {config} | {by_fw['khorovod']:.0f} | {by_fw['ddp']:.0f} | "
                         f"{by_fw['khorovod'] / by_fw['ddp']:.2f}x | {efficiency(throughput, config, 'khorovod'):.2f} | "
                         f"{efficiency(throughput, config, 'ddp'):.2f} |")
    return "\n".join(lines)


def plot(results: dict[str, dict[str, dict[str, float]]], path: Path, note: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    width = 0.38
    for ax, (model, throughput) in zip(axes[0], results.items()):
        configs = list(throughput)
        for k, fw in enumerate(FRAMEWORKS):
            values = [efficiency(throughput, c, fw) for c in configs]
            bars = ax.bar([i + (k - 0.5) * width for i in range(len(configs))], values, width,
                          label="khorovod" if fw == "khorovod" else "DDP (gloo)")
            ax.bar_label(bars, fmt="%.2f", fontsize=8)
        cores = os.cpu_count() or 1
        ideal = [min(1.0, cores / CONFIGS[c][0]) for c in configs]  # N ranks on fewer cores share them
        ax.plot(range(len(configs)), ideal, "k_", markersize=28, label=f"ideal on {cores} cores")
        ax.set_xticks(range(len(configs)), [c.replace(", ", "\n") for c in configs], fontsize=8)
        ax.set_title(f"{model}, batch {BATCH[model]} per rank")
        ax.set_ylabel("throughput(N) / (N x throughput(1))")
        ax.set_ylim(0, 1.25)
        ax.legend(fontsize=8)
    fig.suptitle(f"Training scaling efficiency ({note})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per job (torch_training.py)")
    parser.add_argument("--steps", type=int, default=8, help="steps per round")
    parser.add_argument("--out", type=Path, default=Path("scaling.png"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    results = measure(args.models.split(","), args.repeat, args.rounds, args.steps)
    note = f"load average {load:.1f} -> {os.getloadavg()[0]:.1f}"
    print(f"{note}\n{table(results)}")
    plot(results, args.out, note)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
