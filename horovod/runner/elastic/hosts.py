"""The driver's memory of hosts: the order they were first seen in, and which are blacklisted.

Order matters: slots are filled host by host in this order, so hosts that were there first keep
the low ranks (rank 0 holds the state everyone syncs from) and new hosts are appended. A host
where a worker failed is blacklisted: for good without a cooldown range (Horovod's default), else
for a randomised time that doubles with each failure of that host, between the range's bounds.
Time comes in as an argument, so all of this is tested without waiting.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from horovod.runner.hosts import HostInfo


class HostUpdate(enum.IntFlag):
    """How the usable hosts changed (Horovod's `HostUpdateResult` values)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = 3


@dataclass
class _Blacklisting:
    failures: int = 0
    until: float | None = None  # None: for good


@dataclass
class HostManager:
    cooldown_range: tuple[int, int] | None = None
    rng: random.Random = field(default_factory=random.Random)
    _order: list[str] = field(default_factory=list)
    _slots: dict[str, int] = field(default_factory=dict)  # the usable hosts, as last discovered
    _blacklist: dict[str, _Blacklisting] = field(default_factory=dict)

    def update(self, discovered: list[HostInfo], now: float) -> HostUpdate:
        """Take the newest discovery answer; what changed among the usable hosts."""
        before = self.usable(now)
        for host in discovered:
            if host.hostname not in self._order:
                self._order.append(host.hostname)
        self._slots = {host.hostname: host.slots for host in discovered}
        return _difference(before, self.usable(now))

    def usable(self, now: float) -> dict[str, int]:
        """Discovered hosts not blacklisted at `now`, in assignment order, with their slots."""
        return {host: self._slots[host] for host in self._order
                if host in self._slots and not self.is_blacklisted(host, now)}

    def is_blacklisted(self, host: str, now: float) -> bool:
        entry = self._blacklist.get(host)
        return entry is not None and (entry.until is None or now < entry.until)

    def blacklist(self, host: str, now: float) -> float | None:
        """A worker failed on `host`: exclude it. Returns the cooldown in seconds (None: for good)."""
        entry = self._blacklist.setdefault(host, _Blacklisting())
        entry.failures += 1
        if self.cooldown_range is None:
            entry.until = None
            return None
        low, high = self.cooldown_range
        delay = low * 2 ** (entry.failures - 1) + self.rng.uniform(0, 1) * low
        delay = min(max(delay, low), high)
        entry.until = now + delay
        return delay

    def all_blacklisted(self, now: float) -> bool:
        """Every discovered host is out, and none will come back by itself."""
        return bool(self._slots) and all(
            host in self._blacklist and self._blacklist[host].until is None for host in self._slots)


def _difference(before: dict[str, int], after: dict[str, int]) -> HostUpdate:
    result = HostUpdate.no_update
    for host in set(before) | set(after):
        old, new = before.get(host, 0), after.get(host, 0)
        if new > old:
            result |= HostUpdate.added
        elif new < old:
            result |= HostUpdate.removed
    return result
