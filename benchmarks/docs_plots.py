"""The plots of docs/performance.md that gather figures recorded there, drawn without running anything.

    python benchmarks/docs_plots.py                  # writes docs/performance-{training,mpi,gpu}.png
    python benchmarks/docs_plots.py --out-dir /tmp/plots

Two plots of that page come straight from the benchmark that measured them and are not drawn here:
the sweep of every collective (`python -m horovod.benchmarks ... --out-dir`, its busbw.png) and
the scaling efficiencies (`benchmarks/scaling.py --out`). The ones here combine fresh jobs, rank
counts or machines that each ran on its own, so their figures are copied from the tables of
docs/performance.md, which say where, when and with which command each was taken: a new
measurement goes into that table and into the matching constant below.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from horovod.benchmarks.report import bus_factor, plot

DOCS = Path(__file__).resolve().parents[1] / "docs"
MIB = 1 << 20
VM = "2-vCPU VM, CPU"
CORES16 = "16-core VM, CPU"
H100 = "H100, CUDA tensors staged"
H200 = "H200, NCCL"

# khorovod's steps/s (or samples/s) over the peer's, per fresh job: performance.md's training tables.
TRAINING: list[tuple[str, str, list[float]]] = [
    (VM, "torch mlp vs DDP (gloo)", [1.477, 1.405, 1.399, 1.415, 1.507]),
    (VM, "torch MNIST net vs DDP (gloo)", [1.23, 1.21, 1.13, 1.154]),
    (VM, "torch cnn vs DDP (gloo)", [1.05]),
    (VM, "Keras mlp vs MultiWorkerMirrored", [2.81, 3.26]),
    (VM, "JAX mlp vs jax.distributed", [3.01, 2.95]),
    (CORES16, "torch mlp vs DDP, 1 thread/rank", [1.351]),
    (CORES16, "torch mlp vs DDP, 4 threads/rank", [1.473]),
    (CORES16, "torch cnn vs DDP, 1 thread/rank", [0.979]),
    (H100, "torch mlp vs DDP (gloo)", [0.96]),
    (H200, "torch mlp vs DDP (NCCL)", [0.996, 0.995, 0.996, 0.995]),
    (H200, "torch cnn vs DDP (NCCL)", [0.994, 0.988, 0.990, 0.991]),
    (H200, "torch MNIST net vs DDP (NCCL)", [0.987, 0.980, 0.983, 0.985]),
]

# hvd.allreduce_ under `horovodrun --mpi` over raw mpi4py Allreduce, time ratio of the medians and
# its range over the fresh jobs (None: not recorded), per machine and rank count, at 1, 4, 16 MiB.
MPI_RATIOS: dict[str, list[tuple[float, float | None, float | None]]] = {
    f"{VM}, 2 ranks": [(1.29, 1.26, 2.32), (1.06, None, None), (1.01, None, None)],
    f"{VM}, 4 ranks": [(1.53, 0.90, 2.24), (1.26, None, None), (0.87, None, None)],
    f"{CORES16}, 2 ranks": [(1.66, 1.12, 1.67), (1.24, 1.06, 1.28), (1.09, 0.60, 1.30)],
    f"{CORES16}, 4 ranks": [(1.64, 1.45, 2.04), (1.27, 1.10, 1.82), (1.08, 0.97, 1.11)],
}
MPI_SIZES = ["1 MiB", "4 MiB", "16 MiB"]

# In-place float32 allreduce on the H200, 2 ranks sharing the GPU: median time per op in us.
NCCL_TIMES_US = {
    "khorovod (NCCL)": [4525, 4529, 4531, 4534, 9093, 36387, 144858],
    "torch.distributed (NCCL)": [4514, 4516, 4518, 4527, 9066, 36267, 144657],
}
NCCL_SIZES = [4 << 10, 64 << 10, MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]


def training_plot(path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    colors = dict(zip([VM, CORES16, H100, H200], ["tab:blue", "tab:green", "tab:purple", "tab:red"]))
    for row, (machine, label, jobs) in enumerate(TRAINING):
        y = len(TRAINING) - 1 - row
        ax.barh(y, statistics.median(jobs), color=colors[machine], alpha=0.55,
                label=machine if machine not in {m for m, _, _ in TRAINING[:row]} else None)
        ax.plot(jobs, [y] * len(jobs), "k.", markersize=5)
        ax.text(max(jobs) + 0.05, y, f"{statistics.median(jobs):.3g}x ({len(jobs)} job{'s' * (len(jobs) > 1)})",
                va="center", fontsize=7)
    ax.axvline(1.0, color="k", linewidth=0.8)
    ax.set_yticks(range(len(TRAINING)), [label for _, label, _ in reversed(TRAINING)], fontsize=8)
    ax.set_xlabel("khorovod throughput / the peer's (bar: median over fresh jobs; dots: each job)", fontsize=8)
    ax.set_xlim(0, 3.9)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("Training, 2 ranks: khorovod against each framework's own distribution", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def mpi_plot(path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(MPI_RATIOS)
    for k, (setup, ratios) in enumerate(MPI_RATIOS.items()):
        xs = [i + (k - (len(MPI_RATIOS) - 1) / 2) * width for i in range(len(MPI_SIZES))]
        ax.bar(xs, [r for r, _, _ in ratios], width, label=setup)
        for x, (ratio, low, high) in zip(xs, ratios):
            if low is not None:
                ax.plot([x, x], [low, high], "k-", linewidth=0.8)
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.axhline(1.3, color="grey", linewidth=0.8, linestyle="--", label="1.3x")
    ax.set_xticks(range(len(MPI_SIZES)), MPI_SIZES)
    ax.set_ylabel("time / raw mpi4py Allreduce", fontsize=8)
    ax.set_title("allreduce through horovod.torch over MPI (lines: range over fresh jobs)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def nccl_plot(path: Path) -> str:
    factor = bus_factor("allreduce", 2)
    summary = {"allreduce": {system: [{"bytes": n, "busbw_GBps": n / (us * 1e-6) / 1e9 * factor}
                                      for n, us in zip(NCCL_SIZES, times)]
                             for system, times in NCCL_TIMES_US.items()}}
    return plot(summary, 2, str(path), "one H200, NCCL 2.28.9 (socket)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=DOCS)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    training_plot(args.out_dir / "performance-training.png")
    mpi_plot(args.out_dir / "performance-mpi.png")
    print(nccl_plot(args.out_dir / "performance-gpu.png"))
    print(f"plots: {args.out_dir}/performance-{{training,mpi,gpu}}.png")


if __name__ == "__main__":
    main()
