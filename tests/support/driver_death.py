"""What the tests of a dying driver (Spark, Ray) share: a long-running worker, and the driver
script run as a process of its own, so that the test can kill it and time what follows.

`train_until_stopped` runs in the workers: the engines import it by name (this folder is on the
workers' PYTHONPATH), so it travels by reference."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Mapping

from leftovers import seconds_until_gone

BOUND_SECONDS = 5.0  # the promise: every worker gone within 5 s of its driver


def train_until_stopped(pid_dir: str, seconds: float = 120.0) -> int:
    """Be one rank of a long job that never needs its driver again once it trains; shared memory
    and sockets are in use, and `pid_dir/rank<N>` holds `{"rank": N, "pid": ...}` once ready."""
    import numpy as np

    import horovod.numpy as hvd

    hvd.init()
    hvd.allreduce(np.ones(1 << 16, np.float32), name="warmup")
    path = os.path.join(pid_dir, f"rank{hvd.rank()}")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": hvd.rank(), "pid": os.getpid()}, f)
    os.rename(path + ".tmp", path)
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(0.05)
    return hvd.rank()


class Driver:
    """A driver script running in `tmp`, its output in `tmp/driver.log`, its workers' pid files
    in `tmp/pids` (its first argument)."""

    def __init__(self, tmp: Path, script: str, args: list[str], env: Mapping[str, str]) -> None:
        self.pid_dir, self._log_path = tmp / "pids", tmp / "driver.log"
        self.pid_dir.mkdir()
        (tmp / "driver.py").write_text(script)
        self._log = open(self._log_path, "wb")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen([sys.executable, str(tmp / "driver.py"), str(self.pid_dir), *args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=dict(env), cwd=tmp,
                                     start_new_session=True)

    def wait_for_workers(self, ranks: int, seconds: float) -> dict[int, int]:
        """The pid of each rank once all `ranks` are ready (fails the test after `seconds`)."""
        deadline = time.monotonic() + seconds
        while len(self._ready()) < ranks and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = self._ready()
        assert len(workers) == ranks, self._log_path.read_text(errors="replace")[-3000:]
        return workers

    def kill_and_time(self, workers: dict[int, int], engine: str) -> None:
        """SIGKILL the driver; assert that every worker goes within `BOUND_SECONDS`, and say when."""
        self.proc.kill()
        self.proc.wait()
        gone = seconds_until_gone(workers.values(), BOUND_SECONDS)
        for rank, pid in workers.items():
            assert gone[pid] is not None, f"rank {rank} outlived its driver by {BOUND_SECONDS} s"
            print(f"{engine}: rank {rank} gone {gone[pid]:.2f} s after its driver was killed")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()

    def _ready(self) -> dict[int, int]:
        found = [json.loads(path.read_text()) for path in self.pid_dir.glob("rank*") if path.suffix != ".tmp"]
        return {info["rank"]: info["pid"] for info in found}


@contextlib.contextmanager
def driver(tmp: Path, script: str, args: list[str], env: Mapping[str, str]) -> Iterator[Driver]:
    """Run `script` as a driver (see `Driver`) for the duration; it is killed at the end."""
    running = Driver(tmp, script, args, env)
    try:
        yield running
    finally:
        running.stop()
