"""The root cause is named every time, whatever order the ranks exit in.

Rank 1 raises mid-training; rank 0, in a collective that needs rank 1, fails in turn. Which of
the two processes the launcher sees exit first is a race, so each scenario repeats, and two of
them force the exit order both ways (an `atexit` hook registered before `hvd.init()` runs after
Horovod's own shutdown and holds the process back). horovodrun must name rank 1 and its
exception every time, and rank 0's error must say that rank 1 *failed*.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from horovod.runner import run
from horovod.runner.report import root_cause
from runner_helpers import horovodrun

pytestmark = pytest.mark.timeout(120)

REPEATS = 6

SCRIPT = textwrap.dedent("""\
    import atexit, os, sys, time
    import numpy as np

    me = int(os.environ["HOROVOD_RANK"])
    delayed = int(sys.argv[2]) if len(sys.argv) > 2 else -1
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0

    def leave():  # registered first, so it runs last: after hvd.shutdown() announced the exit
        if me == delayed:
            time.sleep(delay)
        with open(os.path.join(sys.argv[1], f"exit.{me}"), "w") as f:
            f.write(repr(time.time()))

    atexit.register(leave)
    import horovod.numpy as hvd
    hvd.init()
    hvd.allreduce(np.ones(4), name="warmup")
    if me == 1:
        raise ValueError("rank 1 broke on purpose")
    for step in range(50):
        hvd.allreduce(np.ones(4), name=f"step{step}")
    """)


def _run_once(tmp_path: Path, delayed: int | None, *extra: str,
              how: str = "exit code 1") -> tuple[str, dict[int, float]]:
    script = tmp_path / "fail_on_rank_1.py"
    script.write_text(SCRIPT)
    for old in tmp_path.glob("exit.*"):
        old.unlink()
    args = [str(tmp_path)] + ([str(delayed)] if delayed is not None else []) + list(extra)
    proc = horovodrun("-np", "2", sys.executable, str(script), *args, timeout=60)
    assert proc.returncode == 1, proc.stderr
    summary = proc.stderr[proc.stderr.index("Horovod detected"):]
    assert f"rank 1 on host localhost (local rank 1): {how}" in summary, summary
    assert "Root cause, the exception rank 1 reported:" in summary, summary
    assert "ValueError: rank 1 broke on purpose" in summary, summary
    assert "HorovodInternalError" not in summary, summary  # rank 0's secondary error stays above
    # The survivor says that its peer failed, not that it merely shut down.
    assert "rank 1 failed (an exception escaped its script" in proc.stderr, proc.stderr
    exits = {int(path.name.split(".")[1]): float(path.read_text()) for path in tmp_path.glob("exit.*")}
    return summary, exits


@pytest.mark.parametrize("delayed", [None, 1, 0], ids=["natural-order", "failing-rank-exits-last",
                                                        "failing-rank-exits-first"])
def test_the_failing_rank_is_named_whichever_rank_exits_first(tmp_path, delayed):
    for _ in range(REPEATS):
        _, exits = _run_once(tmp_path, delayed)
        if delayed is not None:  # the order really was forced
            other = 1 - delayed
            assert exits[other] < exits[delayed], exits


def test_a_failing_rank_still_exiting_when_the_job_is_stopped_is_named(tmp_path):
    # Rank 1 takes longer to exit than the others are given after the first exit (2 s): it is
    # stopped, and still named, with what happened to it.
    _, exits = _run_once(tmp_path, 1, "6",
                         how="it reported an exception and was still exiting when the job was stopped")
    assert 1 not in exits  # it was stopped in its exit hook, as promised


def test_horovod_run_names_the_failing_rank_too():
    # A function that raises under horovod.run leaves like an uncaught exception: at once, and
    # telling its peers that it failed.
    def train_then_fail_on_rank_1() -> None:  # defined here: cloudpickle ships it by value
        import numpy as np

        import horovod.numpy as hvd

        hvd.init()
        hvd.allreduce(np.ones(4), name="warmup")
        if hvd.rank() == 1:
            raise ValueError("rank 1 broke on purpose")
        for step in range(50):
            hvd.allreduce(np.ones(4), name=f"step{step}")

    for _ in range(3):
        with pytest.raises(RuntimeError) as info:
            run(train_then_fail_on_rank_1, num_proc=2)
        message = str(info.value)
        assert "rank 1 on host localhost (local rank 1): exit code 1" in message, message
        assert "ValueError: rank 1 broke on purpose" in message, message


def test_choice_between_failures():
    # Exit order [0, 1]: rank 0 saw rank 1 leave before it failed, so rank 1 is the cause.
    assert root_cause([0, 1], {"0", "after.0", "1"}) == 1
    # A rank that recorded nothing (killed, crashed) beats one whose error came after a departure.
    assert root_cause([0, 1], {"0", "after.0"}) == 1
    # ...but not one that recorded its own exception.
    assert root_cause([0, 1], {"1"}) == 1
    assert root_cause([1, 0], {"0"}) == 0
    # Otherwise the first to exit.
    assert root_cause([2, 0, 1], set()) == 2
    assert root_cause([2, 0, 1], {"0", "1", "2"}) == 2
    assert root_cause([2, 0], {"0", "after.0", "2", "after.2"}) == 2
