"""The benchmark's khorovod:mpi system runs (through horovodrun --mpi) and checks its results."""

import json
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
