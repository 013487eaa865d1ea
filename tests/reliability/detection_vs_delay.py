"""How long a partition takes to be noticed, and whether a slow link is ever mistaken for one,
against the link's delay (not run in CI; needs root, nftables and tc, like test_bad_networks).

    python tests/reliability/detection_vs_delay.py [DETECTION_SECONDS] [DELAYS_MS...]

For each one-way delay (default 0 50 200 500 ms, with up to a fifth of it as jitter), two ranks
on two namespace hosts: first 12 training steps over the link (any error is a false alarm), then
a job that trains until a full partition, timing each rank's error. Results: docs/reliability.md.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent / "support")]

import badnet  # noqa: E402
from tests.reliability import test_bad_networks as bad  # noqa: E402


def measure(delay: float, detection: float) -> tuple[float, bool, list[float]]:
    """(seconds for 12 steps, whether they all passed, each rank's seconds to notice a partition)."""
    bad.DETECTION_SECONDS = detection
    with tempfile.TemporaryDirectory() as tmp:
        net = None
        tag = f"dv{int(delay * 1000)}"
        try:
            net = badnet.build(tag, "10.248.77", delay=delay, jitter=delay / 5)
            bad.install_ssh(net, Path(tmp))
            steady = bad.Job(net, Path(tmp), steps=12)
            ok = steady.finish(timeout=600) == 0
            seconds = max(steady.ranks.get(r, {}).get("done", float("nan")) for r in (0, 1))
            if not ok:
                print(steady.output()[-3000:], file=sys.stderr)
            if not ok:
                return seconds, ok, [float("nan")] * 2
            job = bad.Job(net, Path(tmp), steps=0)
            job.wait_ready(timeout=600)
            cut = time.time()
            net.partition()
            job.finish(timeout=600)
            noticed = [job.ranks[r].get("caught", float("nan")) - cut for r in (0, 1)]
            return seconds, ok, noticed
        finally:
            badnet.destroy(net, tag)


def main() -> None:
    detection = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    delays = [int(v) for v in sys.argv[2:]] or [0, 50, 200, 500]
    print(f"HOROVOD_FAILURE_DETECTION_SECONDS={detection:g}")
    print("one-way delay | 12 steps | false alarm | partition noticed by rank 0, rank 1")
    for ms in delays:
        seconds, ok, noticed = measure(ms / 1000, detection)
        print(f"{ms} ms | {seconds:.2f} s | {'no' if ok else 'YES'} | {noticed[0]:.1f} s, {noticed[1]:.1f} s", flush=True)


if __name__ == "__main__":
    main()
