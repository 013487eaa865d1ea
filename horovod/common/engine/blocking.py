"""Which threads of this rank are blocked waiting for a collective: the local half of deadlock
detection.

A deadlock between ranks (rank 0 blocked in `allgather_object`, rank 1 in `barrier`, typically
after one rank failed or took another branch) can never resolve, but the stall inspector only
warns about it after a minute. It is decided when every member of a process set is blocked
waiting for one of that set's ops and the cycle finds nothing ready: no member can submit what
the others wait for. A rank reports itself blocked (`waits`) once a thread has waited
`GRACE_SECONDS` without the rank submitting anything meanwhile; the margin is for a second
thread of the same rank that is about to submit the op the others need, which this rank cannot
see coming. The cycle carries the report to the other members, and decides (`cycle.py`).
"""

from __future__ import annotations

import time

from horovod.common.engine.handles import Handle

GRACE_SECONDS = 3.0


class BlockedWaits:
    """The handles that threads of this rank wait on, since when, and the last submission."""

    def __init__(self) -> None:
        self._since: dict[Handle, float] = {}
        self._reported: set[Handle] = set()
        self.last_submit = 0.0

    def block(self, handle: Handle) -> None:
        self._since[handle] = time.monotonic()

    def unblock(self, handle: Handle) -> None:
        self._since.pop(handle, None)
        self._reported.discard(handle)

    def waits(self, set_id: int, now: float) -> list[str]:
        """What this rank is stuck waiting for in process set `set_id` ([] when not stuck)."""
        if not self._since or now - self.last_submit < GRACE_SECONDS:  # every cycle asks: answer fast
            return []
        since = self._since.copy()  # other threads block and unblock meanwhile
        return sorted(h.name for h, t in since.items()
                      if h.set_id == set_id and now - t >= GRACE_SECONDS and not h.poll())

    def newly_stuck(self, now: float) -> bool:
        """True once for each wait that has just become long enough to report: a cycle is then
        due so the other members learn of it."""
        if now - self.last_submit < GRACE_SECONDS:
            return False
        fresh = [h for h, t in self._since.copy().items() if now - t >= GRACE_SECONDS and h not in self._reported]
        self._reported.update(fresh)
        return bool(fresh)
