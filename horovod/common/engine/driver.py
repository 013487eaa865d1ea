"""Who runs the engine's cycles, when, and what happens when one fails.

Either the engine thread (overlapped work, cycles a peer starts) or a framework thread that
would otherwise only wait for its handle (`drive_until`); the drive lock lets exactly one of
them run cycles at a time, and both run the same `Cycle.run`. Each has its own wake-up pipe. Between cycles the driver sleeps on the transport's
`PeerActivity`, re-examines pending work for stalls, and hands the job over at shutdown. A
failure in a cycle fails every pending op with its cause and ends the engine.
"""

from __future__ import annotations

import os
import select
import threading
import time
from threading import get_ident
from typing import TYPE_CHECKING, Callable

from horovod.common.engine.blocking import BlockedWaits
from horovod.common.engine.coordinator import stall_message
from horovod.common.engine.cycle import Cycle
from horovod.common.engine.handles import Entry, Handle
from horovod.common.engine.state import SetState, ShutdownState
from horovod.common.engine.waiting import Waiter
from horovod.common.exceptions import DeviceError, HorovodInternalError
from horovod.common.logging import log
from horovod.common.settings import Settings
from horovod.common.transport.base import PeerFailure, Transport

if TYPE_CHECKING:
    from horovod.common.timeline import Timeline

# How often pending work is re-examined for stalls while nothing else happens.
_TICK_SECONDS = 0.5
# How long an idle engine thread that a peer calls into leaves for a local thread to submit and
# answer itself (see _loop). An answer from the engine thread only tells the peer that nothing is
# ready, so waiting costs nothing; answering too early costs both a cycle. On a loaded or
# oversubscribed machine a thread between two ops is often off its core for a millisecond or more.
_JOIN_GRACE_SECONDS = 5e-3


class Driver:
    """Runs `cycle` on the engine thread or on a waiting caller's thread, one at a time, and
    fails every pending op when a cycle fails. `Engine` adds the side that submits work."""

    def __init__(self, settings: Settings, transport: Transport, timeline: Timeline | None) -> None:
        self.settings = settings
        self.transport = transport
        self.rank = transport.rank
        self.sets: dict[int, SetState] = {}
        self.shutdown = ShutdownState()
        self.blocked = BlockedWaits()  # threads of this rank waiting for a collective (deadlocks)
        self.cycle = Cycle(settings, transport, timeline, self.sets, self.shutdown, on_fatal=self._die,
                           blocked=self.blocked)
        # Two wake-up pipes: one for the idle engine thread, one for a caller driving the engine
        # (sharing one, either could drain a wake-up meant for the other).
        self._wake_r, self._wake_w = os.pipe()
        self._driver_wake_r, self._driver_wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w, self._driver_wake_r, self._driver_wake_w):
            os.set_blocking(fd, False)
        self._activity = transport.activity  # how a sleeper learns that a peer is talking
        self._idle_waiter = Waiter(self._activity, self._wake_r, driver=False)
        self._driver_waiter = Waiter(self._activity, self._driver_wake_r, driver=True)
        self.stopped = False  # the engine thread has ended (a plain bool: every submission reads it)
        self.fatal: HorovodInternalError | None = None
        self._dead_peer: int | None = None  # the rank whose failure ended the engine, if one did
        self._drive = threading.Lock()  # held by whichever thread runs cycles (see drive_until)
        self._finished = False  # no more cycles: the job shut down or the engine failed
        self._thread = threading.Thread(target=self._run, name="hvd-engine", daemon=True)
        self._thread_ident: int | None = None  # the engine thread's (a property of the Thread is slower)

    def start(self) -> None:
        self._thread.start()
        self._thread_ident = self._thread.ident

    @property
    def _executing(self) -> list[Entry | None]:
        """The entries of the operation the cycle runs right now: failed too if the engine dies
        mid-operation (the fault tests also watch it to kill a rank mid-operation)."""
        return self.cycle.executing

    def wake(self, driver: bool = False) -> None:
        try:
            os.write(self._driver_wake_w if driver else self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass

    def request_shutdown(self, wait_for_peers: bool = True) -> None:
        """Leave the job.

        Normally this rank keeps serving negotiation until every rank has shut down, so ranks
        still working in process sets without us can finish; anything that needs us fails at
        once. A rank leaving because of an error does not wait: it announces its departure and
        goes, so it is the first to exit and the launcher reports its error as the root cause.
        """
        self.shutdown.wait_for_peers = wait_for_peers
        self.shutdown.requested = True
        self.wake()
        if not wait_for_peers:
            self._thread.join(5.0)
            if self._thread.is_alive():
                self.transport.close()
            return
        while True:
            self._thread.join(60.0)
            if not self._thread.is_alive():
                return
            waiting_for = sorted(set(range(self.transport.size)) - self.shutdown.ranks)
            log.warning("rank %d: waiting for ranks %s to finish and shut down", self.rank, waiting_for)

    def departed_peers(self) -> set[int]:
        """The peers this rank has seen leave the job or die: once there is one, an error of this
        rank is most likely a consequence of theirs, not a root cause (see `basics.report_failure`)."""
        gone = self.shutdown.ranks - {self.rank}
        return gone | {self._dead_peer} if self._dead_peer is not None else gone

    # -- who runs the engine: its own thread, or a framework thread that would only wait -----
    def drive_until(self, handle: Handle) -> None:
        """Wait for `handle`, running the engine's cycles on the calling thread meanwhile.

        A thread blocked on a small collective would sit idle while the engine thread is woken
        to do the work and then wakes it back: two thread hand-offs and a GIL contest that cost
        more than the op itself. So a waiting thread runs the cycles itself; the engine thread
        only works while no framework thread waits (overlap with compute, peer-initiated cycles).
        Where another thread drives (another waiting thread, or the engine thread in a cycle),
        this one just waits for the handle. Queueing for the drive lock instead would deadlock:
        a driver only leaves once its own op is done, which may need ops that threads queued
        behind it have yet to submit, on this rank or another.
        """
        if not self._finished and get_ident() != self._thread_ident and self._drive.acquire(False):
            try:
                self._activity.set_caller_driving(True)
                self._guarded(self._drive_loop, handle)
            finally:
                self._hand_back()
        if handle.poll():
            return
        self.blocked.block(handle)
        try:
            handle.block_until_done(None)
        finally:
            self.blocked.unblock(handle)

    def _hand_back(self) -> None:
        """A caller stops driving: the engine thread takes over what is left, if anything is.

        A peer that has started a cycle meanwhile needs an answer at once only if this rank has
        work pending, which the cycle may advance. With none, the engine thread would only leave
        a local thread its grace to submit (see _loop), and it hears of the peer anyway: waking
        it after every op of a training loop where peers run ahead takes the ranks' cores."""
        try:
            self._activity.set_caller_driving(False)
        finally:
            self._drive.release()
        # Whether a peer waits is asked last, and only with work pending: the look costs a round
        # trip between cores (shared memory) or a probe (MPI), once per op otherwise.
        if (self._finished or self._has_new_work()
                or (self._has_pending() and self._activity.waiting_after_release())):
            self.wake()

    def _drive_loop(self, handle: Handle) -> None:
        """Cycles until `handle` completes: at once while there is work, else after sleeping
        until a peer starts one. The thread counts as blocked (deadlock detection) only from
        its first sleep on: an op that completes in the cycles at hand costs no bookkeeping."""
        blocked = False
        try:
            while not handle.poll() and not self._finished:
                if self._cycle_due() or self._driver_waiter.wait(0):
                    if not self.cycle.run():  # `_run_cycle`, written out: once per op
                        self._finished = True
                    continue
                if not blocked:
                    self.blocked.block(handle)
                    blocked = True
                timeout = self._idle_timeout()
                self._driver_waiter.wait(_TICK_SECONDS if timeout is None else min(timeout, _TICK_SECONDS))
                self._drain_wakes(self._driver_wake_r)
                if not self._has_new_work():
                    self._check_stalls()
        finally:
            if blocked:
                self.blocked.unblock(handle)

    def _run(self) -> None:
        try:
            self._guarded(self._loop)
        finally:
            self.stopped = True
            self.cycle.executor.device.close()
            self.transport.close()
            self._idle_waiter.close()
            self._driver_waiter.close()
            for fd in (self._wake_r, self._wake_w, self._driver_wake_r, self._driver_wake_w):
                os.close(fd)

    def _guarded(self, work: Callable[..., None], *args: object) -> None:
        """Run engine work; a failure fails every pending op with its cause and ends the engine."""
        try:
            work(*args)
        except PeerFailure as exc:
            self._dead_peer = exc.rank
            if exc.rank in self.shutdown.failed:  # it said so before its connection closed
                self._die(str(self.shutdown.error({exc.rank}, f"Horovod stopped on rank {self.rank}")))
                return
            self._die(f"Horovod stopped on rank {self.rank}: {exc}. "
                      "The rank named here is the one that failed; look at its output for the cause.")
        except DeviceError as exc:
            self._die(f"Horovod stopped on rank {self.rank}: {exc}.")
        except (KeyboardInterrupt, SystemExit) as exc:  # a caller interrupted mid-cycle: peers can't resume
            self._die(f"Horovod stopped on rank {self.rank}: interrupted ({type(exc).__name__}) during a cycle")
            raise
        except BaseException as exc:  # a bug of ours: report it on every pending op, never hang
            log.error("engine failed: %r", exc, exc_info=True)
            self._die(f"Horovod's engine failed on rank {self.rank}: {exc!r}")

    def _die(self, message: str) -> None:
        self._finished = True
        in_flight = sorted({name for state in self.sets.values() for name in state.names}
                           | {entry.name for entry in self._executing if entry is not None})
        if in_flight:
            shown = ", ".join(in_flight[:5]) + (", ..." if len(in_flight) > 5 else "")
            message += f" Ops in flight on this rank: {shown}."
        self.fatal = HorovodInternalError(message)
        self.cycle.executor.device.abort()  # GPU kernels waiting for a dead peer end now
        self._fail_everything(self.fatal)

    def _fail_everything(self, error: BaseException) -> None:
        for state in self.sets.values():
            for entry in state.take_pending():
                entry.finish(error=error)
        for entry in self._executing:
            if entry is not None:
                entry.finish(error=error)

    def _has_new_work(self) -> bool:
        # Runs at least once per op: a plain loop, not any() over a generator (twice the cost).
        if (self.shutdown.requested and not self.shutdown.announced) or self.cycle.forced:
            return True
        for state in self.sets.values():
            if state.new:
                return True
        return False

    def _cycle_due(self) -> bool:
        """A lone op starts at once; ops arriving while others are in flight are batched for up
        to one cycle time so they can be fused."""
        if self.shutdown.requested and not self.shutdown.announced:
            return True  # our shutdown flag goes out in the next cycle
        new, busy = self.cycle.forced, False
        for state in self.sets.values():  # `_has_new_work` and `_busy` in one pass (once per op)
            if state.new:
                new = True
            if state.unsent or state.waiting:
                busy = True
        return new and (not busy or self.shutdown.requested
                        or time.monotonic() >= self.cycle.last_start + self.cycle.tunables.cycle_time_ms / 1000.0)

    def _idle_timeout(self) -> float | None:
        """How long the engine may wait for peers before it has something to do itself."""
        if self._has_new_work():
            return max(0.0, self.cycle.last_start + self.cycle.tunables.cycle_time_ms / 1000.0 - time.monotonic())
        return _TICK_SECONDS if self._has_pending() else None

    def _has_pending(self) -> bool:
        for state in self.sets.values():
            if state.has_pending():
                return True
        return False

    def _run_cycle(self) -> None:
        if not self.cycle.run():
            self._finished = True

    def _drain_wakes(self, fd: int) -> None:
        try:
            os.read(fd, 4096)
        except BlockingIOError:
            pass

    def _loop(self) -> None:
        """The engine thread: sleep (without the drive lock) until there is work or a peer
        starts a cycle, then take the lock and do it, unless a waiting caller already has."""
        while not self._finished:
            timeout = 0.0 if self._cycle_due() else self._idle_timeout()
            last_cycle = self.cycle.last_start
            peer_started = False
            if timeout != 0:
                peer_started = self._idle_waiter.wait(timeout)
                if peer_started and timeout is None and not self._has_new_work():
                    # A peer started a cycle while we had nothing to submit. Our next op is most
                    # likely being submitted right now by a thread that will wait for it and run
                    # the cycle itself (drive_until); a cycle without it would achieve nothing and
                    # cost another. Give that thread a moment; answer the peer only if none came.
                    self._drain_wakes(self._wake_r)  # a wake-up already had must not cut the moment short
                    select.select([self._wake_r], [], [], _JOIN_GRACE_SECONDS)
            self._drain_wakes(self._wake_r)
            with self._drive:
                if self._finished:
                    return
                if peer_started and self.cycle.last_start != last_cycle:
                    # A waiting thread ran cycles since the peer's message woke us (it answered
                    # it): a message there now is the next cycle's, which that thread will most
                    # likely answer too; answering it here would be a cycle with nothing in it.
                    continue
                if self._cycle_due() or (peer_started and self._driver_waiter.wait(0)):
                    self._run_cycle()
                elif timeout is not None and not self._has_new_work():
                    self._check_stalls()

    def _check_stalls(self) -> None:
        """Warn (coordinator) or escalate stalled work; may request a cycle."""
        s = self.settings
        if s.stall_check_disable:
            return
        now = time.monotonic()
        if self.blocked.newly_stuck(now):
            self.cycle.forced = True  # tell the other members; if all are stuck, the cycle decides
        for state in self.sets.values():
            if any(now - since >= s.stall_check_time_seconds for _, since in state.unsent.values()):
                self.cycle.forced = True  # stale cache hits renegotiate so the coordinator sees them
            coordinator = state.coordinator
            if coordinator is None or not coordinator.table:
                continue
            if s.stall_shutdown_time_seconds > 0 and coordinator.stalled(now, s.stall_shutdown_time_seconds):
                self.cycle.forced = True
            elif now - state.last_stall_warning >= s.stall_check_time_seconds:
                stalled = coordinator.stalled(now, s.stall_check_time_seconds)
                if stalled:
                    state.last_stall_warning = now
                    log.warning("%s", stall_message(stalled, s.stall_check_time_seconds, False))
