"""Spin or sleep: one policy for every thread of ours that waits for a peer on this host.

A sleeping thread takes 30-60 us to wake on an idle machine, more than a whole small op, so a
wait that the peer will end sooner is cheaper spun. Spinning helps only while the peer runs at
the same time, though: on a loaded machine it takes the core from whoever would make progress.
`SpinPolicy` learns which case holds from the waits themselves: it keeps a moving average of how
many recent waits (those that did not find their condition already met, spun or slept alike)
ended within the spin budget, and spins while that share is high enough to pay for the spins
that miss; otherwise it sleeps at once.

Because slept waits teach it as well, no phase of the job can keep it from spinning: two ranks
that both sleep and wake each other see waits of one wake-up, inside the budget, and go back to
spinning. The fixed back-off this replaced (no spinning for 64 waits after 8 spins in a row that
found nothing) counted misses only, and a spin shorter than the peer's wake-up always misses.
"""

from __future__ import annotations

import os
import time
from typing import Callable

# How long a thread that would only block otherwise (a framework thread driving the engine)
# spins before it sleeps: several wake-ups' worth.
SPIN_SECONDS = 200e-6
# How long the engine thread spins: it may share its rank's core with the framework's compute
# (gradients reduced during backward), so it spins about one piece's worth, no more.
BACKGROUND_SPIN_SECONDS = 20e-6
# Weight of the newest wait in the moving average, and the share of waits a spin must end for
# spinning to go on: a miss costs one budget of CPU, a hit saves a wake-up (30-60 us idle, up to
# milliseconds on a loaded machine).
_NEWEST_WEIGHT = 1 / 16
_WORTH_SPINNING = 0.25


class SpinPolicy:
    """Decides how long one waiter spins, from how long its recent waits took."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled  # spinning can help at all: every local rank has a core of its own
        self.hits = 1.0  # moving average: 1 for a wait that ended within the budget, else 0

    def budget(self, limit: float) -> float:
        """How long to spin now, given the caller's limit: all of it, or nothing while too few
        recent waits ended within it (spinning would not have ended them)."""
        return limit if self.enabled and self.hits >= _WORTH_SPINNING else 0.0

    def record(self, seconds: float, limit: float) -> None:
        """Learn from a wait that had to wait at all (however it ended) and took `seconds`."""
        self.hits += ((seconds <= limit) - self.hits) * _NEWEST_WEIGHT

    def spin(self, done: Callable[[], bool], limit: float, yield_core: bool) -> bool:
        """Spin on `done` for up to our budget; True if it came true meanwhile.

        `yield_core`: offer the core between looks, where something of ours may need it (a thread
        that spins beside the framework's compute, or ranks that may share a core). Elsewhere not:
        the kernel hands a yielded core to any other runnable process for a whole time slice
        (milliseconds), so a rank that yields on a core shared with another job waits that long
        for a peer that answered in microseconds."""
        budget = self.budget(limit)
        if budget:
            end = time.perf_counter() + budget
            while time.perf_counter() < end:
                if done():
                    return True
                if yield_core:
                    os.sched_yield()
            return done()  # it may have come true while another thread had the core
        return False
