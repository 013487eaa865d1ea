"""Horovod's negation flags (`--no-log-hide-timestamp`, `--no-timeline-mark-cycles`,
`--no-mpi-threads-disable`) are accepted, reach the workers as the variable switched off, win
over a config file that switches it on, and do not warn as flags without effect."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runner_helpers import horovodrun

pytestmark = pytest.mark.timeout(60)

WORKER = '''
import os
import horovod.numpy as hvd
hvd.init()
keys = ("HOROVOD_LOG_HIDE_TIME", "HOROVOD_TIMELINE_MARK_CYCLES", "HOROVOD_MPI_THREADS_DISABLE")
print("ENV", hvd.rank(), *(os.environ.get(k) for k in keys), flush=True)
hvd.shutdown()
'''


def test_negation_flags_reach_every_rank_and_override_the_config_file(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    config = tmp_path / "config.yaml"
    config.write_text("timeline:\n  mark_cycles: true\nlogging:\n  with_timestamp: false\n"
                      "library_options:\n  mpi_threads_disable: true\n")
    result = horovodrun("-np", "2", "--config-file", str(config), "--timeline-filename", str(tmp_path / "t.json"),
                        "--no-log-hide-timestamp", "--no-timeline-mark-cycles", "--no-mpi-threads-disable",
                        sys.executable, str(script), timeout=50, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(line.split(":", 1)[1] for line in result.stdout.splitlines() if ">:ENV " in line)
    assert lines == ["ENV 0 0 0 0", "ENV 1 0 0 0"], result.stdout
    assert "no effect" not in result.stderr, result.stderr


def test_the_positive_spellings_still_switch_on() -> None:
    from horovod.runner.launch import parse_args

    on = parse_args(["-np", "1", "--log-hide-timestamp", "--timeline-mark-cycles", "--mpi-threads-disable", "true"])
    off = parse_args(["-np", "1", "--no-log-hide-timestamp", "--no-timeline-mark-cycles", "--no-mpi-threads-disable",
                      "true"])
    assert (on.log_with_timestamp, on.timeline_mark_cycles, on.mpi_threads_disable) == (False, True, True)
    assert (off.log_with_timestamp, off.timeline_mark_cycles, off.mpi_threads_disable) == (True, False, False)
