"""Process sets: collectives over a subset of ranks.

A `ProcessSet` is a sorted list of global ranks plus the id the runtime gives it when it is
registered (static sets at `init()`, dynamic ones with `add_process_set`). Root ranks passed to
broadcast stay *global* ranks, as in Horovod. The global set (id 0) holds no ranks of its own:
its members are those of the current round, which the runtime knows.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from horovod.common import runtime, wire
from horovod.common.mpi_library import process_set_ranks
from horovod.common.engine.messages import OpType


class ProcessSet:
    """A subset of the ranks that runs collectives among themselves: `ProcessSet([0, 2])`, or one
    rank per process of an mpi4py communicator. Register it with `hvd.init(process_sets=[...])` or
    `hvd.add_process_set()`, then pass it as `process_set=` to any collective."""

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

    def require_registered(self) -> None:
        """Raise a ValueError that says how to register this set, before any op is queued on it."""
        if self.process_set_id is None:
            raise ValueError(
                f"{self} is not registered: pass it to hvd.init(process_sets=[...]) or call "
                "hvd.add_process_set() first"
            )

    def size(self) -> int | None:
        return len(self.ranks) if self.process_set_id is not None else None

    def rank(self) -> int | None:
        """This process's rank within the set (None if unregistered or not a member)."""
        if self.process_set_id is None:
            return None
        me = runtime.current().settings.topology.rank
        return self.ranks.index(me) if me in self.ranks else None

    def included(self) -> bool | None:
        if self.process_set_id is None:
            return None
        return runtime.current().settings.topology.rank in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


class GlobalProcessSet(ProcessSet):
    """Every rank of the current round (id 0); empty outside `init()` ... `shutdown()`."""

    def __init__(self) -> None:  # no ranks to keep: ProcessSet.__init__ would store some
        self.mpi_comm = None
        self.process_set_id: int | None = 0

    @property  # type: ignore[override]
    def ranks(self) -> list[int]:
        rt = runtime.peek()
        return rt.global_ranks if rt is not None else []


global_process_set = GlobalProcessSet()


class Exchanger(Protocol):
    """What the agreement check needs of a transport: every rank's bytes, to every rank."""

    size: int

    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]: ...


def register_static(process_sets: Sequence[ProcessSet] | None, size: int,
                    communicator: Any = None) -> list[ProcessSet]:
    """The global set, then those of `init(process_sets=...)` numbered from 1 in the order given.

    `communicator` is the job's MPI communicator (a job mpirun started), which gives the ranks of
    sets made from MPI communicators."""
    sets: list[ProcessSet] = [global_process_set]
    seen = {tuple(range(size))}
    for ps in process_sets or []:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"process_sets must be ProcessSet objects, got {ps!r}")
        if ps.mpi_comm is not None:
            if communicator is None:
                raise NotImplementedError("process sets from MPI communicators need a job started by mpirun "
                                          "(or horovodrun --mpi)")
            ps.ranks = process_set_ranks(ps.mpi_comm, communicator)
        if tuple(ps.ranks) in seen:
            raise ValueError(f"process set {ps.ranks} is given twice (or equals the global set)")
        if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= size:
            raise ValueError(f"process set ranks {ps.ranks} must be within 0..{size - 1}")
        seen.add(tuple(ps.ranks))
        ps.process_set_id = len(sets)
        sets.append(ps)
    return sets


def check_static_sets_agree(transport: Exchanger, sets: list[ProcessSet]) -> None:
    """Static sets must be identical everywhere; say which ranks differ instead of hanging later."""
    mine = tuple(tuple(ps.ranks) for ps in sets[1:])
    everyone = [wire.decode(p) for p in transport.exchange(list(range(transport.size)), wire.encode(mine))]
    if any(theirs != mine for theirs in everyone):
        detail = "; ".join(f"rank {r}: {sets_}" for r, sets_ in enumerate(everyone))
        raise ValueError(f"Different ranks tried to set up mismatching process sets at init ({detail}). "
                         "Pass the same process_sets= on every rank.")


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new set at run time. Every rank must call it (needs HOROVOD_DYNAMIC_PROCESS_SETS=1)."""
    rt = runtime.current()
    if not rt.settings.dynamic_process_sets:
        raise ValueError("adding process sets after init needs HOROVOD_DYNAMIC_PROCESS_SETS=1 "
                         "(or hvd.init(process_sets='dynamic'))")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.mpi_comm is not None:
        raise NotImplementedError("process sets from MPI communicators can only be given to init(), as in Horovod")
    size = rt.settings.topology.size
    if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= size:
        raise ValueError(f"process set ranks {ps.ranks} must be within 0..{size - 1}")
    for existing in rt.process_sets.values():
        if existing.ranks == ps.ranks:
            raise ValueError(f"a process set with ranks {ps.ranks} already exists "
                             f"(id {existing.process_set_id})")
    set_id = rt.negotiate(OpType.ADD_PROCESS_SET, f"process_set.add.{ps.ranks}", tuple(ps.ranks), -1)
    ps.process_set_id = set_id
    rt.process_sets[set_id] = ps
    rt.name_counters.pop(set_id, None)  # ids are reused: a new set starts numbering afresh
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set on every rank (collective). The global set is never removed."""
    rt = runtime.current()
    if not rt.settings.dynamic_process_sets:
        raise ValueError("removing process sets needs HOROVOD_DYNAMIC_PROCESS_SETS=1")
    set_id = process_set.process_set_id
    if set_id in (None, 0) or set_id not in rt.process_sets:
        return False
    removed = rt.negotiate(OpType.REMOVE_PROCESS_SET, f"process_set.remove.{set_id}", (), set_id)
    del rt.process_sets[set_id]
    process_set.process_set_id = None
    return bool(removed)
