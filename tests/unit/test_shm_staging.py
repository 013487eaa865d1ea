"""The choice between the small staging slots and the ring (transport/shm/staging.py)."""

from horovod.common.transport.shm.staging import RECHECK_EVERY, StagingChoice

MIB64 = 64 << 20


def ops(choice: StagingChoice, count: int, slots_seconds: float, ring_seconds: float) -> list[bool]:
    """Run `count` large ops whose staging takes these times on each path; which path each took."""
    taken = []
    for _ in range(count):
        ring = choice.use_ring()
        choice.record(ring, (ring_seconds if ring else slots_seconds) / MIB64)
        taken.append(ring)
    return taken


def test_staging_at_memory_speed_never_tries_the_ring():
    assert not any(ops(StagingChoice(), 100, slots_seconds=0.005, ring_seconds=0.008))


def test_slow_slots_move_to_a_faster_ring_and_look_back_now_and_then():
    choice = StagingChoice()
    taken = ops(choice, 1 + 4 * RECHECK_EVERY, slots_seconds=0.028, ring_seconds=0.008)
    assert taken[0] is False and taken[1] is True  # slow (2.4 GB/s): the ring is tried at once, and kept
    back = [i for i, ring in enumerate(taken) if not ring]
    assert len(back) == 1 + 4 and all((i + 1) % RECHECK_EVERY == 0 for i in back[1:])


def test_the_ring_is_left_once_the_slots_are_fast_again():
    choice = StagingChoice()
    ops(choice, 5, slots_seconds=0.028, ring_seconds=0.008)
    assert choice.ring
    taken = ops(choice, RECHECK_EVERY + 3, slots_seconds=0.005, ring_seconds=0.008)
    first_look = taken.index(False)
    assert not any(taken[first_look:])


def test_a_ring_no_faster_than_slow_slots_is_not_kept():
    # Staging slowed by something else (a busy core): both paths alike, so the slots stay.
    choice = StagingChoice()
    taken = ops(choice, 50, slots_seconds=0.030, ring_seconds=0.025)
    assert taken[1:3] == [True, True] and not any(taken[3:])


def test_the_first_op_through_the_ring_does_not_count():
    # It maps the ring's pages as it goes (28 ms for 64 MiB here), then runs at its speed (6 ms).
    choice = StagingChoice()
    first = [choice.use_ring() for _ in range(3)]
    choice.record(False, 0.028 / MIB64)
    assert choice.use_ring()
    choice.record(True, 0.028 / MIB64)
    assert choice.use_ring()
    choice.record(True, 0.006 / MIB64)
    assert first == [False] * 3 and choice.ring


def test_a_forced_choice_is_kept_whatever_is_measured():
    assert all(ops(StagingChoice("ring"), 40, slots_seconds=0.001, ring_seconds=1.0))
    assert not any(ops(StagingChoice("slots"), 40, slots_seconds=1.0, ring_seconds=0.001))
