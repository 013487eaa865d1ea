"""Where a rank stages a large two-rank allreduce: the small slots, or a ring as large as a cache.

A two-rank allreduce hands every piece over through memory the writer rewrites a few rounds
later. When the peer has just read a line, the writer's next store to it must first take the
peer's copy away. Where the two cores share a cache that costs little; where the host has put
them apart (a virtual machine's cores on different core complexes, for minutes at a time, which
nothing inside the machine shows), each such store waits for the far cache, and staging 64 MiB
took 28 ms instead of 4.5: the whole allreduce ran at a quarter of its speed. A ring of slots
larger than the last-level cache is rewritten only after the peer's copies have left its
caches, so its stores do not wait; but it moves every piece through main memory, which is
slower where the cores do share a cache (about half the speed there).

So each rank measures what its own staging costs and picks per operation (the reader follows
the writer's choice, which travels with the first round; the two directions choose apart):
the small slots while staging through them runs at memory speed; the ring once they turn out
much slower than it; and while on the ring, every so often the small slots again, to notice
when the host has put the cores back together.
"""

from __future__ import annotations

# Smaller operations always stage through the small slots, and are not measured: a handful of
# rounds says little, and their staging is a small part of their time.
RING_MIN_BYTES = 8 << 20
# The ring: larger than the last-level cache of one core complex on the machines seen (32 MiB).
RING_BYTES = 32 << 20
# A smaller ring (a fusion region reduced by HOROVOD_FUSION_THRESHOLD) cannot outlast a cache.
RING_MIN_SIZE = 16 << 20
# Staging slower than this (seconds per byte, 4 GB/s) through the small slots is worth comparing
# with the ring; at memory speed (13-20 GB/s here) it never is.
SLOW_SECONDS_PER_BYTE = 1 / 4e9
# The small slots must cost this many times the ring's staging for the ring to be chosen: the
# ring also makes the peer read from main memory.
RING_ADVANTAGE = 2.0
# While on the ring, one large operation in this many stages through the small slots again.
RECHECK_EVERY = 16


class StagingChoice:
    """This rank's choice between the small slots and the ring, from its own measurements
    (`mode` "auto"), or always the one `mode` names ("slots", "ring": HOROVOD_SHM_STAGING)."""

    def __init__(self, mode: str = "auto") -> None:
        self.mode = mode
        self.ring = mode == "ring"  # the choice in force
        self._slots_cost: float | None = None  # seconds per byte, the latest large op's through each
        self._ring_cost: float | None = None
        self._ring_touched = False  # the ring's memory has been through one op
        self._ops = 0

    def use_ring(self) -> bool:
        """For the next large operation: stage through the ring?"""
        self._ops += 1
        if self.ring and self.mode == "auto" and self._ops % RECHECK_EVERY == 0:
            return False  # look at the small slots again
        return self.ring

    def record(self, ring: bool, cost: float) -> None:
        """A large operation staged through the ring (or the small slots) at `cost` seconds per
        byte (its median piece's)."""
        if self.mode != "auto":
            return
        if ring and not self._ring_touched:
            # The first op through the ring also maps its pages (a fault per page): not its speed.
            self._ring_touched = True
            return
        if ring:
            self._ring_cost = cost
        else:
            self._slots_cost = cost
        slots, ring_cost = self._slots_cost, self._ring_cost
        if slots is None:
            return
        if ring_cost is None:
            self.ring = slots > SLOW_SECONDS_PER_BYTE  # try the ring once the slots are slow
        else:
            self.ring = slots > RING_ADVANTAGE * ring_cost
