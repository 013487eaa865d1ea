"""The local half of deadlock detection: when this rank counts as stuck, and the message every
rank raises."""

import time

from horovod.common.engine import blocking
from horovod.common.engine.blocking import BlockedWaits
from horovod.common.engine.coordinator import deadlock_message
from horovod.common.engine.handles import Handle
from horovod.common.engine.readiness import BLOCKED, agree


def handle(name: str, set_id: int = 0) -> Handle:
    h = Handle(1, False, name)
    h.set_id = set_id
    return h


def test_a_wait_counts_only_after_the_grace_and_only_in_its_own_set():
    waits, grace = BlockedWaits(), blocking.GRACE_SECONDS
    a, b = handle("allreduce.a"), handle("barrier.noname", set_id=1)
    waits.block(a)
    waits.block(b)
    start = time.monotonic()
    assert waits.waits(0, start + grace / 2) == []
    assert waits.waits(0, start + grace) == ["allreduce.a"] and waits.waits(1, start + grace) == ["barrier.noname"]
    waits.last_submit = start + grace  # a submission on this rank: maybe another thread is not stuck
    assert waits.waits(0, start + grace + 0.1) == []
    waits.unblock(a)
    assert waits.waits(0, start + 3 * grace) == []


def test_a_new_stuck_wait_asks_for_one_cycle():
    waits = BlockedWaits()
    h = handle("allreduce.a")
    waits.block(h)
    later = time.monotonic() + blocking.GRACE_SECONDS
    assert waits.newly_stuck(later) is True and waits.newly_stuck(later + 1) is False
    h.complete(0)
    assert waits.waits(0, later) == []


def test_agree_reads_replies_that_carry_what_a_member_waits_for():
    ready, _, slow_path, _ = agree((0, 1), [(BLOCKED, 0b1, 0, ["allreduce.a"]), (0, 0b1, 0)], num_bits=1)
    assert ready == [0] and not slow_path


def test_deadlock_message_names_each_rank_and_the_set():
    text = deadlock_message(2, {1: ["barrier.noname"], 0: ["allreduce.a", "allgather.b"]})
    assert text.startswith("Deadlock in process set 2")
    assert text.index("rank 0 waits for allreduce.a, allgather.b") < text.index("rank 1 waits for barrier.noname")
    assert "the global process set" in deadlock_message(0, {0: ["x"]})
