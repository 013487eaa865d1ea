"""Round numbers: which generation of the job a joining process belongs to.

Every `init()` joins one round; everything that generation puts in the rendezvous store is
scoped by its number (`transport.<round>`). The number comes from the store, never from a
counter in the worker: a process started later (a replacement, a new worker) must land in the
same round as the survivors that re-initialise, whatever rounds it never saw.

Two ways in, one numbering:
- a fixed-size group (our launcher's ranks) joins with `RoundBook.join`: each member goes to the
  first round it is not yet part of that still has room;
- a planned round (a driver fixed who is in it and with which slots) is `RoundBook.open`ed, and
  workers pick it up with `newest_round`.
Pure logic, no I/O: the rendezvous server holds one `RoundBook`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Iterable


@dataclass
class _Round:
    size: int
    members: set[str] = field(default_factory=set)

    def has_room_for(self, member: str, size: int) -> bool:
        return self.size == size and member not in self.members and len(self.members) < size


class RoundBook:
    """Who is in which round (rounds are numbered from 1)."""

    def __init__(self) -> None:
        self._rounds: list[_Round] = []
        self._first_open = 0  # rounds before this index are full: a join never looks at them

    def join(self, member: str, size: int) -> int:
        """The round `member` of a group of `size` joins now: the first one it is not part of yet
        and that still has room, else a new one."""
        if size < 1:
            raise ValueError(f"a round needs at least one member, not {size}")
        for index in range(self._first_open, len(self._rounds)):
            if self._rounds[index].has_room_for(member, size):
                return self._add(index, member)
        self._rounds.append(_Round(size))
        return self._add(len(self._rounds) - 1, member)

    def open(self, members: Collection[str]) -> int:
        """Number a round whose members a driver has already chosen; no `join` lands in it."""
        if not members:
            raise ValueError("a round needs at least one member")
        self._rounds.append(_Round(len(members), set(members)))
        self._skip_full()
        return len(self._rounds)

    def _add(self, index: int, member: str) -> int:
        self._rounds[index].members.add(member)
        self._skip_full()
        return index + 1

    def _skip_full(self) -> None:
        while self._first_open < len(self._rounds) and \
                len(self._rounds[self._first_open].members) >= self._rounds[self._first_open].size:
            self._first_open += 1


def newest_round(published: Iterable[int], after: int) -> int | None:
    """The planned round a worker that last took part in round `after` should look at: the newest
    one published since (older ones are over), or None when there is none yet."""
    newer = [number for number in published if number > after]
    return max(newer) if newer else None
