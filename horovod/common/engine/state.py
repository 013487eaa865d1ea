"""What the engine keeps between cycles: the work of each process set, and who left the job.

Both are shared by the three parts of the engine: the framework threads that submit work
(`Engine.enqueue`), the thread that drives the cycles (`driver`) and the cycle itself (`cycle`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from horovod.common.engine.coordinator import Coordinator
from horovod.common.engine.handles import Entry
from horovod.common.engine.response_cache import ResponseCache
from horovod.common.exceptions import HorovodInternalError

if TYPE_CHECKING:
    from horovod.common.timeline import Timeline


@dataclass
class SetState:
    """Everything the engine keeps per process set."""

    set_id: int
    members: tuple[int, ...]
    cache: ResponseCache
    coordinator: Coordinator | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    new: list[Entry] = field(default_factory=list)  # enqueued, not yet seen by a cycle
    names: set[str] = field(default_factory=set)  # every name enqueued and not yet answered
    unsent: dict[str, tuple[Entry, float]] = field(default_factory=dict)  # cached, waiting for peers
    waiting: dict[str, Entry] = field(default_factory=dict)  # answered by a response soon
    joined: bool = False
    last_stall_warning: float = 0.0

    @classmethod
    def for_members(cls, set_id: int, members: tuple[int, ...], rank: int, cache_capacity: int,
                    timeline: Timeline | None) -> SetState:
        """A fresh set as `rank` sees it: the set's first member coordinates it (and only the
        global set's coordinator records negotiations in the timeline)."""
        coordinator = None
        if members and members[0] == rank:
            coordinator = Coordinator(members, timeline if set_id == 0 else None)
        return cls(set_id, members, ResponseCache(cache_capacity), coordinator)

    def has_pending(self) -> bool:
        return bool(self.unsent or self.waiting or (self.coordinator and self.coordinator.table))

    def take_pending(self) -> list[Entry]:
        """Every entry not yet completed, removed from the set (to be failed by the caller)."""
        with self.lock:
            entries = self.new + [e for e, _ in self.unsent.values()] + list(self.waiting.values())
            self.new, self.unsent, self.waiting = [], {}, {}
            self.names.clear()
        return entries


@dataclass
class ShutdownState:
    """Who is leaving the job: this rank on request, its peers as their flags arrive in a cycle."""

    requested: bool = False  # this rank called shutdown
    wait_for_peers: bool = True  # keep serving negotiation until every rank has shut down
    announced: bool = False  # our shutdown flag reached every peer
    ranks: set[int] = field(default_factory=set)  # ranks known to have shut down
    failed: set[int] = field(default_factory=set)  # of those, the ranks that left because of an error

    @property
    def failing(self) -> bool:
        """This rank leaves because of an error: it does not wait for peers, and says so."""
        return self.requested and not self.wait_for_peers

    def error(self, gone: set[int], name: str) -> HorovodInternalError:
        """Why a collective that needs ranks which have left can never complete.

        A rank that left through an uncaught exception is named as failed, so the survivors'
        errors point at its error as the root cause instead of at a script that merely ended.
        """
        failed = sorted(gone & self.failed)
        if failed:
            who = ", ".join(map(str, failed))
            return HorovodInternalError(
                f"{name}: rank {who} failed (an exception escaped its script, so it left the job), so this "
                "collective can never complete. Rank "
                f"{who}'s error is the root cause: look at its output.")
        who = ", ".join(map(str, sorted(gone)))
        return HorovodInternalError(
            f"{name}: rank {who} has shut down (it called hvd.shutdown() or its script ended), so this "
            "collective can never complete. If that rank failed, its error is the root cause; otherwise "
            "make every rank run the same collectives before exiting.")
