"""Recovery time of an elastic job: SIGKILL of one of 4 workers -> the survivors' next committed step.

    python tests/elastic/recovery_time.py [RUNS]

Four hosts (`localhost`, `127.0.0.1`, `127.0.0.2`, `127.0.0.3`, one slot each) run
`train_torch.py`; rank 3 kills itself with SIGKILL at a different step each run, noting the time.
The time until rank 0 commits its first step with 3 workers is printed per run, then the median.
Default settings (failure detection, discovery every second). Results: docs/performance.md.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def one_run(kill_step: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        (Path(out) / "hosts").write_text("localhost:1\n127.0.0.1:1\n127.0.0.2:1\n127.0.0.3:1\n")
        script = Path(out) / "discover.sh"
        script.write_text(f"#!/bin/sh\ncat {out}/hosts\n")
        script.chmod(0o755)
        env = dict(os.environ, ELASTIC_KILL=f"0:{kill_step}:3", ELASTIC_STEP_SECONDS="0.05",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(HERE.parents[1]), os.environ.get("PYTHONPATH")])))
        subprocess.run([sys.executable, "-m", "horovod.runner.launch", "-np", "4", "--min-np", "2",
                        "--host-discovery-script", str(script), sys.executable, str(HERE / "train_torch.py"),
                        out, "1", "8"], env=env, check=True, capture_output=True, timeout=300)
        result = json.loads((Path(out) / "result.json").read_text())
        died = float((Path(out) / "killed.0").read_text())
        return min(t for t, n in zip(result["stamps"], result["sizes"]) if n == 3 and t > died) - died


if __name__ == "__main__":
    times = [one_run(2 + run % 4) for run in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3)]
    print(" ".join(f"{t:.2f}" for t in times), f"median {statistics.median(times):.2f} s")
