"""The spin-or-sleep policy: it follows how long waits take, and nothing keeps it from spinning again."""

from __future__ import annotations

import time

from horovod.common.transport.spin import BACKGROUND_SPIN_SECONDS, SPIN_SECONDS, SpinPolicy


def test_spins_while_waits_are_short_and_stops_while_they_are_long() -> None:
    policy = SpinPolicy(enabled=True)
    assert policy.budget(SPIN_SECONDS) == SPIN_SECONDS
    for _ in range(50):  # a loaded machine: every wait takes milliseconds
        policy.record(5e-3, SPIN_SECONDS)
    assert policy.budget(SPIN_SECONDS) == 0.0
    checks = 0

    def never() -> bool:
        nonlocal checks
        checks += 1
        return False

    assert policy.spin(never, SPIN_SECONDS, yield_core=False) is False and checks == 0  # sleeps at once, no spin


def test_slept_waits_that_were_short_bring_spinning_back_within_a_few_waits() -> None:
    """Two ranks that wake each other see waits of one wake-up: the policy must not stay off."""
    policy = SpinPolicy(enabled=True)
    for _ in range(200):
        policy.record(5e-3, SPIN_SECONDS)
    waits = 0
    while policy.budget(SPIN_SECONDS) == 0.0:
        policy.record(60e-6, SPIN_SECONDS)  # one wake-up on an idle machine
        waits += 1
    assert waits <= 6


def test_a_limit_shorter_than_the_waits_counts_them_as_misses() -> None:
    policy = SpinPolicy(enabled=True)
    for _ in range(50):
        policy.record(60e-6, BACKGROUND_SPIN_SECONDS)
    assert policy.budget(BACKGROUND_SPIN_SECONDS) == 0.0


def test_disabled_never_spins_and_spin_ends_when_the_condition_holds() -> None:
    assert SpinPolicy(enabled=False).budget(SPIN_SECONDS) == 0.0
    policy = SpinPolicy(enabled=True)
    looks = 0

    def second_look() -> bool:
        nonlocal looks
        looks += 1
        return looks >= 2

    assert policy.spin(second_look, SPIN_SECONDS, yield_core=True) is True and looks == 2  # even if a yield outlasts the budget
    start = time.perf_counter()
    assert policy.spin(lambda: False, SPIN_SECONDS, yield_core=False) is False
    assert time.perf_counter() - start >= SPIN_SECONDS
