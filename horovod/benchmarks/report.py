"""Turning benchmark runs into numbers: bus bandwidth, summaries, the table and the plot."""

from __future__ import annotations

import statistics
from typing import Iterable

# nccl-tests: busbw = algbw * factor(n), so that every collective's figure compares with the
# bandwidth of the slowest link.
_FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def bus_factor(op: str, ranks: int) -> float:
    return _FACTORS.get(op, _FACTORS["allreduce"])(ranks)


def summarize(runs: Iterable[dict]) -> dict:
    """{op: {system: [row per size]}} over all runs: medians of the runs' medians, best minimum."""
    gathered: dict = {}
    for run in runs:
        report = run["report"]
        for op, rows in report["ops"].items():
            for row in rows:
                per_size = gathered.setdefault(op, {}).setdefault(run["system"], {}).setdefault(row["bytes"], [])
                per_size.append((row, report["ranks"], run.get("round", 0)))
    summary: dict = {}
    for op, systems in gathered.items():
        for system, sizes in systems.items():
            rows = []
            for nbytes, samples in sorted(sizes.items()):
                ranks = samples[0][1]
                median = statistics.median(row["median_s"] for row, _, _ in samples)
                best = min(row["min_s"] for row, _, _ in samples)
                algbw = nbytes / median / 1e9
                rows.append({"bytes": nbytes, "median_s": median, "min_s": best, "algbw_GBps": algbw,
                             "busbw_GBps": algbw * bus_factor(op, ranks), "runs": len(samples),
                             "per_run_median_s": [row["median_s"] for row, _, _ in samples],
                             "rounds": [round_ for _, _, round_ in samples]})
            summary.setdefault(op, {})[system] = rows
    return summary


def human_bytes(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _ours(systems: list[str], ours: str | None) -> str:
    """The system the others are compared with: `ours` if given, else the first of ours listed
    (`khorovod:mpi` in `--systems khorovod:mpi,mpi,khorovod:shm`)."""
    return ours or next((s for s in systems if s.startswith("khorovod")), "khorovod")


def round_ratios(mine: dict, peer: dict) -> list[float]:
    """The peer's time over ours, one per round both ran: each round starts fresh jobs of every
    system in turns, so these ratios show how much separate jobs disagree."""
    theirs = dict(zip(peer["rounds"], peer["per_run_median_s"]))
    return [theirs[r] / t for r, t in zip(mine["rounds"], mine["per_run_median_s"]) if r in theirs]


def _grid(per_system: dict, ours: str) -> tuple[list[str], list[str], list[tuple[int, list, list]]]:
    """What both renderings show: the systems, the peers we compare with, and per size each
    system's row (None where it has none) and, per peer, our speed-up (the ratio of the medians,
    and round by round), None if unknown."""
    systems = list(per_system)
    peers = [s for s in systems if s != ours and ours in systems]
    by = {s: {row["bytes"]: row for row in rows} for s, rows in per_system.items()}
    rows = []
    for nbytes in sorted({row["bytes"] for rows in per_system.values() for row in rows}):
        mine = by[ours].get(nbytes) if ours in by else None
        ratios = [(by[p][nbytes]["median_s"] / mine["median_s"], round_ratios(mine, by[p][nbytes]))
                  if mine and nbytes in by[p] else None for p in peers]
        rows.append((nbytes, [by[s].get(nbytes) for s in systems], ratios))
    return systems, peers, rows


def _ratio(ratios: tuple[float, list[float]] | None) -> str:
    """The ratio of the medians, and the range of the rounds' own ratios when there are several:
    '0.80x' or '0.80x (0.71-0.93)'."""
    if ratios is None:
        return "-"
    overall, per_round = ratios
    text = f"{overall:.2f}x"
    return text if len(per_round) < 2 else f"{text} ({min(per_round):.2f}-{max(per_round):.2f})"


def table(op: str, per_system: dict, ranks: int, ours: str | None = None, latency: bool = False) -> str:
    """A fixed-width table: per size, each system's median time and busbw, and our ratio to each peer."""
    systems, peers, rows = _grid(per_system, _ours(list(per_system), ours))
    head = [f"{'size':>9}"]
    for s in systems:
        head.append(f"{s + (' median / min' if latency else ' time  busbw GB/s'):>27}")
    head += [f"{'vs ' + p:>22}" for p in peers]
    lines = [f"{op}: {ranks} ranks, float32; time = median over iterations of the slowest rank"
             + ("" if latency else f"; busbw = algbw * {bus_factor(op, ranks):.2f}"), " ".join(head)]
    for nbytes, cells_of, ratios in rows:
        cells = [f"{human_bytes(nbytes):>9}"]
        for row in cells_of:
            if row is None:
                cells.append(f"{'-':>27}")
            elif latency:
                cells.append(f"{_time(row['median_s']) + ' / ' + _time(row['min_s']):>27}")
            else:
                cells.append(f"{_time(row['median_s']):>14} {row['busbw_GBps']:>12.2f}")
        cells += [f"{_ratio(r):>22}" for r in ratios]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def markdown(op: str, per_system: dict, ranks: int, ours: str | None = None, latency: bool = False) -> str:
    """The same comparison as `table`, as a Markdown table (for docs)."""
    ours = _ours(list(per_system), ours)
    systems, peers, rows = _grid(per_system, ours)
    column = "median (min)" if latency else "busbw GB/s (time)"
    head = ["size"] + [f"{s} {column}" for s in systems] + [f"{ours} vs {p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for nbytes, cells_of, ratios in rows:
        cells = [human_bytes(nbytes)]
        for row in cells_of:
            if row is None:
                cells.append("-")
            elif latency:
                cells.append(f"{_time(row['median_s'])} ({_time(row['min_s'])})")
            else:
                cells.append(f"{row['busbw_GBps']:.2f} ({_time(row['median_s'])})")
        cells += [_ratio(r) for r in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summary: dict, ranks: int, path: str, title: str) -> str:
    """Bus bandwidth against size, one panel per collective, one line per system. Returns a
    message saying where it went (or why there is no plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'khorovod[bench]')"
    ops = [op for op in ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter") if op in summary]
    if not ops:
        return "no plot: no bandwidth results"
    cols = min(3, len(ops))
    rows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        for system, data in summary[op].items():
            ax.plot([r["bytes"] for r in data], [r["busbw_GBps"] for r in data], marker="o", markersize=3,
                    label=system)
        ax.set_xscale("log", base=2)
        sizes = sorted({r["bytes"] for data in summary[op].values() for r in data})
        ax.set_xticks(sizes, [human_bytes(b).replace(" ", "").replace("iB", "") for b in sizes], fontsize=7,
                      rotation=45)
        ax.minorticks_off()
        ax.set_title(f"{op} ({ranks} ranks)", fontsize=9)
        ax.set_xlabel("bytes", fontsize=8)
        ax.set_ylabel("busbw (GB/s)", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return f"plot: {path}"
