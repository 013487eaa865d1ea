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

Who runs the cycles: the engine thread, or a framework thread that waits for a handle (see
`drive_until`); a lock lets exactly one of them drive at a time. Work overlapped with compute is
the engine thread's; a synchronous op runs on its caller's thread, without thread hand-offs. In
a training loop's steady state (the op is the rank's only work and a cache hit) the submitting
thread runs the op's cycle at once, with the least bookkeeping (`drive_lone`).

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
from horovod.common.exceptions import HorovodInternalError
from horovod.common.settings import Settings
from horovod.common.transport.base import Transport

if TYPE_CHECKING:
    from horovod.common.engine.state import SetState
    from horovod.common.timeline import Timeline


class _Submission(threading.local):
    """Per thread: whether the caller of the submission under way waits for it at once, one call
    (`caller_waits`) or a batch of them (`batch_waits`, which takes precedence). Each has a
    context manager of its own, because `contextlib`'s generator costs a microsecond per op."""

    waits = False
    batch = False
    state: SetState | None = None  # the set a batch went to (its last submission's)


class _CallerWaits:
    """`Engine.caller_waits`: the one call submitted inside is waited for at once."""

    __slots__ = ("_submission",)

    def __init__(self, submission: _Submission) -> None:
        self._submission = submission

    def __enter__(self) -> None:
        self._submission.waits = True

    def __exit__(self, *exc: object) -> None:
        self._submission.waits = False


class _BatchWaits:
    """`Engine.batch_waits`: every call submitted inside is waited for together, right after."""

    __slots__ = ("_engine", "_submission")

    def __init__(self, engine: Engine, submission: _Submission) -> None:
        self._engine, self._submission = engine, submission

    def __enter__(self) -> None:
        self._submission.batch = True

    def __exit__(self, *exc: object) -> None:
        submission = self._submission
        state, submission.state = submission.state, None
        submission.batch = False
        if state is not None:
            self._engine.end_batch(state, failed=exc[0] is not None)


class Engine(Driver):
    """The engine as the collective API sees it: submit entries, then wait on their handles
    (`Handle.wait` drives the engine; see `Driver.drive_until`)."""

    def __init__(self, settings: Settings, transport: Transport, sets: dict[int, tuple[int, ...]],
                 timeline: Timeline | None) -> None:
        super().__init__(settings, transport, timeline if transport.rank == 0 else None)
        submission = self._submission = _Submission()
        self._caller_waits, self._batch_waits = _CallerWaits(submission), _BatchWaits(self, submission)
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
        if self.shutdown.requested or self._stopped.is_set():
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
            for entry in entries:
                names.add(entry.request.name)
            state.new.extend(entries)
        self.blocked.last_submit = time.monotonic()
        submission = self._submission
        if submission.batch:
            submission.state = state  # the batch's end runs it (end_batch)
        elif submission.waits:
            if self.drive_lone(state):
                return
        else:
            self._wake()
        if self._drive.locked():  # a caller driving the engine may be asleep waiting for peers
            self._wake(driver=True)

    def caller_waits(self) -> _CallerWaits:
        """Around a submission whose caller waits for it at once: it will run the cycle itself
        (drive_until), so the engine thread is not woken; waking it would only make the two
        threads compete for the GIL and the drive lock."""
        return self._caller_waits

    def batch_waits(self) -> _BatchWaits:
        """Around several submissions that the caller waits for together right after (an
        optimizer's gradients): as `caller_waits`, and no cycle starts before the last one is
        in, so that one cycle negotiates them all and fusion sees them all."""
        return self._batch_waits

    def end_batch(self, state: SetState, failed: bool) -> None:
        """The batch `batch_waits` enclosed is in: run its cycle now where it is the steady
        state's (`drive_lone`), else the caller's wait runs it. If the batch broke off with an
        error, the engine thread takes what went in, as it would any work nobody waits for."""
        if failed:
            self._wake()
        else:
            self.drive_lone(state)

    def register_set(self, set_id: int, members: tuple[int, ...]) -> None:
        self.cycle.register_set(set_id, members)
