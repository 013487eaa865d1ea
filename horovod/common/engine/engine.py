"""The background engine: one thread per process that negotiates and runs every collective.

Ranks run *cycles* in lockstep. A cycle starts when this rank has new work or a peer starts one
(so an idle job costs nothing, and a lone op never waits for a timer). For every process set
this rank belongs to, in id order, a cycle does:

1. Fast path: all members exchange one small message (status flags, a bitset of the cached
   tensors they have ready, a bitset of cache entries they found stale). The AND of the ready
   bits is the set of cached tensors every member submitted: they run with no coordinator trip.
2. Slow path (only if some member has an uncached or stale request): members send their new
   requests to the coordinator (rank 0 of the set), which answers with the responses that are
   ready, checked for consistency.
3. Execute: every member fuses and runs the same responses in the same order.

One route for every op: submit (`enqueue`) -> negotiate -> execute -> complete the handle. Who
runs the cycles is the engine's decision: a framework thread that waits for a handle runs them
itself (`Driver.drive_until`) when no other thread does, else the engine thread does. A caller
that will wait right after submitting says so (`waited`), so the engine thread is not woken.

A transport failure (dead or hung peer) fails every pending op with the peer named and stops
the engine; `shutdown()` on any rank stops every rank's engine after the current cycle.

One module per part: `driver` (which thread runs the cycles, waking, shutdown, failures),
`cycle` (one cycle), `readiness` (the fast path's decision), `coordinator` (the slow path),
`fusion` (the plan), `executor` (running one response), `response_cache`, and `state` (the work
of each process set, who left the job). This module is the face that the collective API submits to.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from horovod.common.engine.driver import Driver
from horovod.common.engine.handles import Entry
from horovod.common.engine.state import SetState
from horovod.common.exceptions import HorovodInternalError
from horovod.common.settings import Settings
from horovod.common.transport.base import Transport

if TYPE_CHECKING:
    from horovod.common.timeline import Timeline


class _Waited(threading.local):
    """Per thread: how deep it is in `Engine.waited` blocks (submissions whose caller waits at
    once) and in `Engine.batch` blocks, and what it queued in the latter: (set, entries) pairs,
    released to the cycles all at once when the outermost batch ends."""

    def __init__(self) -> None:  # runs once in each thread that uses it
        self.depth = 0
        self.batching = 0
        self.batch: list[tuple[SetState, list[Entry]]] = []


class _WaitedSubmissions:
    """`Engine.waited` and `Engine.batch`: a plain class, because `contextlib`'s generator costs
    a microsecond per op."""

    __slots__ = ("_engine", "_waited", "_batch")

    def __init__(self, engine: Engine, waited: _Waited, batch: bool) -> None:
        self._engine, self._waited, self._batch = engine, waited, batch

    def __enter__(self) -> None:
        waited = self._waited
        waited.depth += 1
        if self._batch:
            waited.batching += 1

    def __exit__(self, kind: type | None, *exc: object) -> None:
        waited = self._waited
        waited.depth -= 1
        if self._batch:
            waited.batching -= 1
            if not waited.batching and waited.batch:
                self._engine.release(waited.batch)
        if kind is not None and not waited.depth:
            # The caller will not wait after all: what it submitted is the engine thread's.
            self._engine.wake()


class Engine(Driver):
    """The engine as the collective API sees it: submit entries, then wait on their handles
    (`Handle.wait` runs the engine on the waiting thread where it can; see `Driver.drive_until`)."""

    def __init__(self, settings: Settings, transport: Transport, sets: dict[int, tuple[int, ...]],
                 timeline: Timeline | None) -> None:
        super().__init__(settings, transport, timeline if transport.rank == 0 else None)
        self._waited = _Waited()
        self._waited_submissions = _WaitedSubmissions(self, self._waited, batch=False)
        self._batch_submissions = _WaitedSubmissions(self, self._waited, batch=True)
        for set_id, members in sets.items():
            self.register_set(set_id, members)

    def enqueue(self, set_id: int, entries: list[Entry]) -> None:
        """Queue entries (all of one call) atomically; ValueError on duplicate names."""
        state = self.sets.get(set_id)
        # Peers known to have left come first: once one has, the engine may also have died of its
        # closed connection, and "rank 1 failed" says more than "rank 1 closed its connection".
        if state is not None and self.shutdown.ranks:  # no set arithmetic per op while nobody has left
            gone = self.shutdown.ranks.intersection(state.members) - {self.rank}
            if gone:
                raise self.shutdown.error(gone, entries[0].name)
        if self.fatal is not None:
            # A fresh error per call that names the op that cannot run (the engine may have died
            # while idle, with no op of ours in flight to name).
            name = entries[0].name if entries else "collective"
            raise HorovodInternalError(f"{name}: {self.fatal}") from self.fatal
        if self.shutdown.requested or self.stopped:
            raise HorovodInternalError("Horovod has been shut down on this rank; call hvd.init() again.")
        if state is None:
            raise ValueError(f"process set {set_id} is not registered (was it removed?)")
        handle = entries[0].handle  # one call's entries share it
        handle.engine = self
        handle.set_id = set_id
        with state.lock:
            names = state.names
            for entry in entries:
                name = entry.request.name
                if name in names:
                    raise ValueError(
                        f"{name.split('.', 1)[0]}: a collective named {name!r} is already in flight on rank "
                        f"{self.rank}. Names must be unique until the op completes: pass a different name= "
                        "or synchronize the first handle."
                    )
            if len(entries) == 1:
                names.add(name)
            else:
                names.update([entry.request.name for entry in entries])
            waited = self._waited
            if not waited.batching:
                state.new.extend(entries)
        self.blocked.last_submit = time.monotonic()
        if waited.batching:
            waited.batch.append((state, entries))  # see `batch`
            return
        if not waited.depth:
            self.wake()  # nobody waits for it now: the engine thread runs it
        if self._drive.locked():  # a caller driving the engine may be asleep waiting for peers
            self.wake(driver=True)

    def release(self, batch: list[tuple[SetState, list[Entry]]]) -> None:
        """Hand a `batch` block's submissions to the cycles, all at once (and empty `batch`)."""
        for state, entries in batch:
            if self.sets.get(state.set_id) is not state:  # the set was removed meanwhile
                for entry in entries:
                    entry.finish(error=HorovodInternalError(
                        f"process set {state.set_id} was removed while {entry.name} was pending"))
                continue
            with state.lock:
                state.new.extend(entries)
        batch.clear()
        if self._drive.locked():  # a caller driving the engine may be asleep waiting for peers
            self.wake(driver=True)

    def waited(self) -> _WaitedSubmissions:
        """Around one submission (one call's entries) that its caller waits for right after (a
        blocking collective): the waiting thread runs its cycle itself (`drive_until`), so the
        engine thread is not woken; waking it would only make the two threads compete for the
        GIL and the drive lock."""
        return self._waited_submissions

    def batch(self) -> _WaitedSubmissions:
        """As `waited`, around several submissions (an optimizer's gradients). They reach the
        cycles when the block ends, all at once: a cycle that starts meanwhile (the engine
        thread answering a peer, another thread's wait) cannot take part of them, so the batch
        negotiates, and fuses, as one."""
        return self._batch_submissions

    def register_set(self, set_id: int, members: tuple[int, ...]) -> None:
        self.cycle.register_set(set_id, members)
