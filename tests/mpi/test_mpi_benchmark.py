"""The benchmark's khorovod:mpi system runs (through horovodrun --mpi) and checks its results."""

import json
import re
import subprocess
import sys

import pytest

from mpirunner import MPIRUN, REPO, child_env


@pytest.mark.skipif(not MPIRUN.exists(), reason="no mpirun next to python")
def test_khorovod_over_mpi_is_a_benchmark_system(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "horovod.benchmarks", "allreduce", "--quick", "--systems",
                           "khorovod:mpi", "--out-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=180, env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert not results["errors"], results["errors"]
    [run] = [r for r in results["runs"] if r["system"] == "khorovod:mpi"]
    timings = run["report"]["ops"]["allreduce"]
    assert run["report"]["ranks"] == 2 and len(timings) == 3
    assert all(t["median_s"] > 0 for t in timings)
    assert "khorovod:mpi" in (tmp_path / "tables.md").read_text()


@pytest.mark.skipif(not MPIRUN.exists(), reason="no mpirun next to python")
def test_mpi_overhead_splits_the_time_of_an_op():
    pytest.importorskip("torch")
    script = str(REPO / "benchmarks" / "mpi_overhead.py")
    proc = subprocess.run([sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", "2", sys.executable, script,
                           "--sizes", "4,64K", "--iters", "5"], capture_output=True, text=True, timeout=180,
                          env=child_env(), cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for size in ("4 bytes", "65536 bytes"):
        section = proc.stdout.split(f"{size}, 2 ranks, side by side", 1)[1]
        for name in ("raw Allreduce (numpy)", "transport.allreduce (Sum)", "hvd.allreduce_ (Sum)"):
            assert re.search(re.escape(name) + r"\s+\d+\.\d us\s+\d+\.\d\dx raw", section), section
        assert re.search(r"back to back: hvd.allreduce_ \d+\.\d us; .*negotiation exchange \d+\.\d us", section)
        assert "cycles per op: MainThread" in section
