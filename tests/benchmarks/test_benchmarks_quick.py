"""The benchmark suite runs (quick mode, as CI does): a check that it works, not a timing."""

import json
import re
import subprocess
import sys

import pytest

from multirank import REPO, child_env

import argparse

from horovod.benchmarks.__main__ import command_for, parse_sizes
from horovod.benchmarks.report import bus_factor, markdown, summarize, table


def test_quick_allreduce_and_latency_write_their_json(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "horovod.benchmarks", "allreduce", "broadcast", "latency",
                           "--quick", "--out-dir", str(out)], capture_output=True, text=True, timeout=240,
                          env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "results.json").read_text())
    assert result["errors"] == [] and result["np"] == 2
    bandwidth = result["summary"]["bandwidth"]
    assert [row["bytes"] for row in bandwidth["allreduce"]["khorovod"]] == [4096, 65536, 1 << 20]
    assert all(row["busbw_GBps"] > 0 for row in bandwidth["broadcast"]["khorovod"])
    assert [row["bytes"] for row in result["summary"]["latency"]["allreduce"]["khorovod"]] == [4, 4096]
    assert "allreduce: 2 ranks" in proc.stdout and "latency (allreduce)" in proc.stdout
    tables = (out / "tables.md").read_text()
    assert "### allreduce, 2 ranks" in tables and "| 4 KiB |" in tables


def test_sizes_factors_and_table():
    assert parse_sizes("4K-256M") == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20,
                                      64 << 20, 256 << 20]
    assert parse_sizes("4K-16K", step=2) == [4096, 8192, 16384]
    assert parse_sizes("4,4K,1M") == [4, 4096, 1 << 20]
    assert bus_factor("allreduce", 4) == 1.5 and bus_factor("allgather", 4) == 0.75
    assert bus_factor("broadcast", 4) == 1.0
    run = lambda system, seconds: {"system": system, "report": {"ranks": 2, "ops": {"allreduce": [
        {"bytes": 1 << 20, "median_s": seconds, "min_s": seconds / 2}]}}}
    summary = summarize([run("khorovod", 0.001), run("gloo", 0.002), run("khorovod", 0.003)])
    ours = summary["allreduce"]["khorovod"][0]
    assert ours["median_s"] == 0.002 and ours["min_s"] == 0.0005 and ours["runs"] == 2
    assert abs(ours["busbw_GBps"] - (1 << 20) / 0.002 / 1e9) < 1e-9
    text = table("allreduce", summary["allreduce"], 2)
    assert "1 MiB" in text and "1.00x" in text  # both medians are 2 ms


def test_ratios_pair_the_rounds_of_fresh_jobs_and_show_their_range():
    run = lambda system, round_, seconds: {"system": system, "round": round_, "report": {"ranks": 2, "ops": {
        "allreduce": [{"bytes": 1 << 20, "median_s": seconds, "min_s": seconds}]}}}
    summary = summarize([run("khorovod:mpi", 0, 0.002), run("mpi", 0, 0.001),
                         run("khorovod:mpi", 1, 0.004), run("mpi", 1, 0.004),
                         run("khorovod:mpi", 2, 0.003), run("mpi", 2, 0.0015)])
    text = markdown("allreduce", summary["allreduce"], 2)
    # Medians 3 ms and 1.5 ms; round by round mpi took 0.5x, 1.0x and 0.5x of khorovod:mpi's time.
    assert "| khorovod:mpi vs mpi |" in text and "| 0.50x (0.50-1.00) |" in text


def test_huge_pages_are_the_same_for_every_system():
    args = argparse.Namespace(np=2, hosts=None, mpirun_args="", horovod_python=None, huge_pages="off")
    for system in ("khorovod:mpi", "mpi", "gloo"):
        _, env, _ = command_for(system, args, [], "out.json")
        assert env["THP_MEM_ALLOC_ENABLE"] == env["NUMPY_MADVISE_HUGEPAGE"] == "0"
    args.huge_pages = "on"
    _, env, _ = command_for("mpi", args, [], "out.json")
    assert env["THP_MEM_ALLOC_ENABLE"] == env["NUMPY_MADVISE_HUGEPAGE"] == "1"


@pytest.mark.parametrize("model,threads", [("mlp", 1), ("mnist", 2)])
def test_torch_training_benchmark_runs_both_and_ends_identical(model, threads):
    # benchmarks/torch_training.py, shortened: khorovod and DDP take the same steps (docs/performance.md).
    pytest.importorskip("torch")
    script = str(REPO / "benchmarks" / "torch_training.py")
    proc = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable, script,
                           "--model", model, "--rounds", "2", "--steps", "2", "--warmup", "1",
                           "--threads", str(threads)],
                          capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{threads} thread(s) per rank on cpu" in proc.stdout
    assert "ratio khorovod / DDP:" in proc.stdout
    assert "largest weight difference after training: 0.00e+00" in proc.stdout


def test_autotune_training_benchmark_reports_every_configuration():
    # benchmarks/autotune_training.py, shortened: one job per configuration and an autotune job
    # whose tuner finishes before the timed steps (docs/performance.md).
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    script = str(REPO / "benchmarks" / "autotune_training.py")
    proc = subprocess.run([sys.executable, script, "--layers", "4", "--measure", "3", "--bayes-samples", "1"],
                          capture_output=True, text=True, timeout=240, env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^\| (.+?) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+x \|$", proc.stdout, re.M)
    assert len(rows) == 7 and rows[0].startswith("bad") and rows[-1] == "autotune", proc.stdout
    assert "finished: True" in proc.stdout and "it scored" in proc.stdout


def test_fresh_jobs_alternates_variants_and_reports_each():
    # benchmarks/fresh_jobs.py, shortened: one job per variant and per peer, beside a busy process,
    # as in docs/performance.md.
    pytest.importorskip("torch")  # gloo
    script = str(REPO / "benchmarks" / "fresh_jobs.py")
    proc = subprocess.run([sys.executable, script, "--jobs", "1", "--sizes", "4K,1M", "--iters", "3",
                           "--systems", "khorovod,gloo", "--busy", "1",
                           "--variant", "bound=", "--variant", "unbound=HOROVOD_CPU_BINDING=0"],
                          capture_output=True, text=True, timeout=240, env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 fresh jobs per system, 2 ranks" in proc.stdout and "1 busy processes beside each job" in proc.stdout
    for name in ("khorovod bound", "khorovod unbound", "gloo"):
        section = proc.stdout.split(f"\n{name}:\n", 1)[1]
        assert "| 4 KiB |" in section and "| 1 MiB |" in section and "job  0: 4096:" in section
        assert re.search(r"job  0: 4096: \d+ us, 1048576: \d+ us; others \d+\.\d\d cores, stolen \d+\.\d\d, "
                         r"copy \d+\.\d GB/s, together \d+\.\d\dx, round trip \d+\.\d\d us", section), section
    assert not subprocess.run(["pgrep", "-f", "while True: pass"], capture_output=True).stdout  # the busy one is gone


def test_scaling_benchmark_reports_every_configuration_and_plots(tmp_path):
    # benchmarks/scaling.py, shortened: 1, 2, 4 ranks and two hosts, as in docs/performance.md.
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    png = tmp_path / "scaling.png"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "scaling.py"), "--models", "mlp", "--rounds",
                           "1", "--steps", "1", "--out", str(png)],
                          capture_output=True, text=True, timeout=400, env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| mlp |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1 rank", "2 ranks", "4 ranks", "4 ranks, two hosts"]
    assert rows[0].split("|")[6].strip() == "1.00"  # one rank is the baseline
    assert all(float(row.split("|")[3]) > 0 and float(row.split("|")[4]) > 0 for row in rows)
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_keras_training_benchmark_runs_each_system(tmp_path):
    # benchmarks/keras_training.py --quick: khorovod (both overlap settings), MWMS and one process alone.
    pytest.importorskip("tensorflow")
    pytest.importorskip("tf_keras")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "keras_training.py"), "--quick",
                           "--variant", "overlap=HOROVOD_TF_OVERLAP_BACKWARD=1", "--variant",
                           "one-node=HOROVOD_TF_OVERLAP_BACKWARD=0"],
                          capture_output=True, text=True, timeout=400, env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header = "| job | khorovod:overlap samples/s | khorovod:one-node samples/s | mwms samples/s | alone samples/s |"
    assert header in proc.stdout
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| 0 |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert all(float(rate) > 0 for rate in cells[1:5])
    assert all(re.fullmatch(r"\d+\.\d\dx", ratio) for ratio in cells[5:7])
    assert re.search(r"khorovod:one-node / mwms over the jobs: min \d+\.\d\dx, median \d+\.\d\dx, max \d+\.\d\dx; "
                     r"khorovod:one-node / alone: median \d+\.\d\dx", proc.stdout)


def test_fusion_cutoff_benchmark_times_both_ways_for_every_size():
    # benchmarks/fusion_cutoff.py, shortened: packed and one by one, per size (docs/performance.md).
    script = str(REPO / "benchmarks" / "fusion_cutoff.py")
    proc = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", "2", sys.executable, script,
                           "--sizes", "4K,512K", "--iters", "20"],
                          capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^\[0\]<stdout>:\s+(\d+)K\s+(\d+)\s+(\d+)\s+([\d.]+)$", proc.stdout, re.M)
    assert [row[0] for row in rows] == ["4", "512"], proc.stdout
    assert all(int(packed) > 0 and int(alone) > 0 for _, packed, alone, _ in rows), rows


def test_docs_plots_draw_only_figures_recorded_in_the_docs(tmp_path):
    # benchmarks/docs_plots.py: the plots of docs/performance.md that gather several runs, drawn from
    # the figures its tables record; every figure it plots must be one the docs give.
    pytest.importorskip("matplotlib")
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import docs_plots
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    recorded = (REPO / "docs" / "performance.md").read_text() + (REPO / "docs" / "engineering-notes.md").read_text()
    figures = [v for _, _, jobs in docs_plots.TRAINING for v in jobs]
    figures += [v for ratios in docs_plots.MPI_RATIOS.values() for triple in ratios for v in triple if v is not None]
    figures += [v for times in docs_plots.NCCL_TIMES_US.values() for v in times]
    unrecorded = [v for v in figures if not re.search(rf"(?<![\d.]){re.escape(str(v))}", recorded)]
    assert not unrecorded, f"plotted but not in docs/performance.md or docs/engineering-notes.md: {unrecorded}"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "docs_plots.py"), "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("training", "mpi", "gpu"):
        png = tmp_path / f"performance-{name}.png"
        assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
