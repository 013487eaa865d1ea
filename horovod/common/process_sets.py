"""Process sets: collectives over a subset of ranks.

A `ProcessSet` is a sorted list of global ranks plus the id the runtime gives it when it is
registered (static sets at `init()`, dynamic ones with `add_process_set`). Root ranks passed to
broadcast stay *global* ranks, as in Horovod.
"""

from __future__ import annotations

from typing import Any, Sequence


class ProcessSet:
    def __init__(self, ranks_or_comm: Sequence[int] | Any) -> None:
        self.mpi_comm = None
        if hasattr(ranks_or_comm, "Get_rank"):  # an mpi4py communicator
            self.mpi_comm = ranks_or_comm
            self.ranks: list[int] = []
        else:
            ranks = [int(r) for r in ranks_or_comm]
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"a process set cannot list a rank twice: {ranks}")
            self.ranks = sorted(ranks)
        self.process_set_id: int | None = None

    def _require_registered(self) -> None:
        if self.process_set_id is None:
            raise ValueError(
                f"{self} is not registered: pass it to hvd.init(process_sets=[...]) or call "
                "hvd.add_process_set() first"
            )

    def size(self) -> int | None:
        return len(self.ranks) if self.process_set_id is not None else None

    def rank(self) -> int | None:
        """This process's rank within the set (None if unregistered or not a member)."""
        from horovod.common import basics

        if self.process_set_id is None:
            return None
        me = basics.rank()
        return self.ranks.index(me) if me in self.ranks else None

    def included(self) -> bool | None:
        from horovod.common import basics

        if self.process_set_id is None:
            return None
        return basics.rank() in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new set at run time. Every rank must call it (needs HOROVOD_DYNAMIC_PROCESS_SETS=1)."""
    from horovod.common import basics

    return basics.runtime().add_process_set(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set on every rank (collective). The global set is never removed."""
    from horovod.common import basics

    return basics.runtime().remove_process_set(process_set)
