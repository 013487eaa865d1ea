"""How the engine waits for peers: the policy (spin or sleep, on which fds, for how long).

A transport only reports activity, through its `PeerActivity` (`Transport.activity`: what shows
that a peer is talking, and how to be told of it); this module decides how to wait for it. Two
threads of a rank may sleep at once, each with a `Waiter` of its own: the idle engine thread, and
the *driver* (the thread that holds the engine's drive lock, see `Engine.drive_until`). Each has
its own wake-up pipe and its own doorbell, so neither swallows a wake-up meant for the other.
"""

from __future__ import annotations

import selectors
import time

from horovod.common.transport.activity import PeerActivity
from horovod.common.transport.spin import SPIN_SECONDS, SpinPolicy


class Waiter:
    """One sleeper's wait for a peer to start talking, or for its wake-up fd to be written."""

    def __init__(self, activity: PeerActivity, wake_fd: int, driver: bool) -> None:
        self._activity = activity
        self._driver = driver
        # Only the driver spins (it would block anyway), where spinning is useful at all.
        self._spin = SpinPolicy(driver and activity.spin_useful)
        # Built once: registering every peer's socket on each wait would cost more than the wait.
        self._selector = selectors.DefaultSelector()
        self._selector.register(wake_fd, selectors.EVENT_READ, False)
        for fd, talking in activity.fds(driver).items():
            self._selector.register(fd, selectors.EVENT_READ, talking)

    def wait(self, timeout: float | None) -> bool:
        """Block until a peer is talking to us, the wake-up fd is readable, or `timeout` passes
        (0: just look). True when a peer is talking (it has started a negotiation cycle); reads
        nothing of the peer's message."""
        activity = self._activity
        if activity.pending():
            return True
        start = time.perf_counter()
        limit = SPIN_SECONDS if timeout is None else min(SPIN_SECONDS, timeout)
        # The driver waits for its own op: nothing else of ours needs the core meanwhile.
        if limit and self._spin.spin(activity.pending, limit, yield_core=False):
            self._spin.record(time.perf_counter() - start, limit)
            return True
        activity.listen(self._driver, True)
        try:
            events = [] if activity.pending() else self._selector.select(timeout)
        finally:
            activity.listen(self._driver, False)
        activity.drain(self._driver)
        if limit:
            self._spin.record(time.perf_counter() - start, limit)
        return activity.pending() or any(key.data for key, _ in events)

    def close(self) -> None:
        self._selector.close()
