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
the engine thread's; a synchronous op runs on its caller's thread, without thread hand-offs.

A transport failure (dead or hung peer) fails every pending op with the peer named and stops
the engine; `shutdown()` on any rank stops every rank's engine after the current cycle.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from horovod.common import wire
from horovod.common.engine.coordinator import Coordinator, stall_message
from horovod.common.engine.executor import Executor
from horovod.common.engine.fusion import plan_fusion
from horovod.common.engine.handles import Entry, Handle
from horovod.common.engine.messages import CACHEABLE, OpType, Request, Response
from horovod.common.engine.response_cache import ResponseCache
from horovod.common.engine.waiting import Waiter
from horovod.common.exceptions import HorovodInternalError
from horovod.common.logging import log
from horovod.common.settings import Settings
from horovod.common.transport.base import PeerFailure, Transport

_SHUTDOWN, _HAS_UNCACHED, _JOINED, _FORCE_SLOW = 1, 2, 4, 8
# How often pending work is re-examined for stalls while nothing else happens.
_TICK_SECONDS = 0.5
# How long an idle engine thread that a peer calls into leaves for a local waiting thread to answer
# (see _loop).
_JOIN_GRACE_SECONDS = 200e-6


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

    def has_pending(self) -> bool:
        return bool(self.unsent or self.waiting or (self.coordinator and self.coordinator.table))


class Engine:
    def __init__(self, settings: Settings, transport: Transport, sets: dict[int, tuple[int, ...]],
                 timeline: object | None) -> None:
        self.settings = settings
        self.transport = transport
        self.rank = transport.rank
        self.timeline = timeline if self.rank == 0 else None
        self.executor = Executor(transport, settings.fusion_threshold, self.timeline)
        self.sets: dict[int, SetState] = {}
        for set_id, members in sets.items():
            self._register_set(set_id, members)
        # Two wake-up pipes: one for the idle engine thread, one for a caller driving the engine
        # (sharing one, either could drain a wake-up meant for the other).
        self._wake_r, self._wake_w = os.pipe()
        self._driver_wake_r, self._driver_wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w, self._driver_wake_r, self._driver_wake_w):
            os.set_blocking(fd, False)
        self._idle_waiter = Waiter(transport, self._wake_r, driver=False)
        self._driver_waiter = Waiter(transport, self._driver_wake_r, driver=True)
        self._shutdown_requested = False
        self._shutdown_announced = False  # our shutdown flag reached every peer
        self._wait_for_peers = True
        self._shut_down_ranks: set[int] = set()
        self._force_cycle = False
        self._stopped = threading.Event()
        self.fatal: HorovodInternalError | None = None
        self._last_cycle_start = 0.0
        self._executing: list[Entry | None] = []  # failed too if the engine dies mid-operation
        self._drive = threading.Lock()  # held by whichever thread runs cycles (see drive_until)
        self._submitter = threading.local()  # will_wait: see caller_waits
        self._finished = False  # no more cycles: the job shut down or the engine failed
        self._thread = threading.Thread(target=self._run, name="hvd-engine", daemon=True)

    # -- framework-thread side --------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def enqueue(self, set_id: int, entries: list[Entry]) -> None:
        """Queue entries (all of one call) atomically; ValueError on duplicate names."""
        if self.fatal is not None:
            # A fresh error per call that names the op that cannot run (the engine may have died
            # while idle, with no op of ours in flight to name).
            name = entries[0].name if entries else "collective"
            raise HorovodInternalError(f"{name}: {self.fatal}") from self.fatal
        if self._shutdown_requested or self._stopped.is_set():
            raise HorovodInternalError("Horovod has been shut down on this rank; call hvd.init() again.")
        state = self.sets.get(set_id)
        if state is None:
            raise ValueError(f"process set {set_id} is not registered (was it removed?)")
        gone = self._shut_down_ranks.intersection(state.members)
        if gone:
            raise self._shutdown_error(gone, entries[0].name)
        with state.lock:
            for entry in entries:
                if entry.name in state.names:
                    op = entry.name.split(".", 1)[0]
                    raise ValueError(
                        f"{op}: a collective named {entry.name!r} is already in flight on rank {self.rank}. "
                        "Names must be unique until the op completes: pass a different name= or "
                        "synchronize the first handle."
                    )
            for entry in entries:
                state.names.add(entry.name)
                entry.handle.engine = self
            state.new.extend(entries)
        if not getattr(self._submitter, "will_wait", False):
            self._wake()
        if self._drive.locked():  # a caller driving the engine may be asleep waiting for peers
            self._wake(driver=True)

    @contextlib.contextmanager
    def caller_waits(self) -> Iterator[None]:
        """Around a submission whose caller waits for it at once: it will run the cycle itself
        (drive_until), so the engine thread is not woken; waking it would only make the two
        threads compete for the GIL and the drive lock."""
        self._submitter.will_wait = True
        try:
            yield
        finally:
            self._submitter.will_wait = False

    def _wake(self, driver: bool = False) -> None:
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
        self._wait_for_peers = wait_for_peers
        self._shutdown_requested = True
        self._wake()
        if not wait_for_peers:
            self._thread.join(5.0)
            if self._thread.is_alive():
                self.transport.close()
            return
        while True:
            self._thread.join(60.0)
            if not self._thread.is_alive():
                return
            waiting_for = sorted(set(range(self.transport.size)) - self._shut_down_ranks)
            log.warning("rank %d: waiting for ranks %s to finish and shut down", self.rank, waiting_for)

    def _shutdown_error(self, gone: set[int], name: str) -> HorovodInternalError:
        who = ", ".join(map(str, sorted(gone)))
        return HorovodInternalError(
            f"{name}: rank {who} has shut down (it called hvd.shutdown() or its script ended), so this "
            "collective can never complete. If that rank failed, its error is the root cause; otherwise "
            "make every rank run the same collectives before exiting.")

    def register_set(self, set_id: int, members: tuple[int, ...]) -> None:
        self._register_set(set_id, members)

    def _register_set(self, set_id: int, members: tuple[int, ...]) -> None:
        coordinator = None
        if members and members[0] == self.rank:
            coordinator = Coordinator(members, self.timeline if set_id == 0 else None)
        self.sets[set_id] = SetState(set_id, members, ResponseCache(self.settings.cache_capacity), coordinator)

    # -- who runs the engine: its own thread, or a framework thread that would only wait -----
    def drive_until(self, handle: Handle) -> None:
        """Run the engine on the calling thread until `handle` completes.

        A thread blocked on a small collective would sit idle while the engine thread is woken
        to do the work and then wakes it back: two thread hand-offs and a GIL contest that cost
        more than the op itself. So a waiting thread runs the cycles itself; the engine thread
        only works while no framework thread waits (overlap with compute, peer-initiated cycles).
        """
        if self._finished or threading.current_thread() is self._thread:
            return
        # Someone else drives (another waiting thread, or the engine thread in a cycle): then just
        # wait for the handle. Queueing for the lock instead would deadlock: a driver only leaves
        # once its own op is done, which may need ops that threads queued behind it have yet to
        # submit, on this rank or another.
        if not self._drive.acquire(blocking=False):
            return
        try:
            if self._finished or handle.poll():
                return
            self.transport.set_caller_driving(True)
            try:
                self._guarded(self._drive_loop, handle)
            finally:
                peer_waiting = self.transport.set_caller_driving(False)
        finally:
            self._drive.release()
        if peer_waiting or self._finished or self._has_new_work():
            self._wake()  # the engine thread takes over what is left

    def _drive_loop(self, handle: Handle) -> None:
        while not handle.poll() and not self._finished:
            if self._cycle_due() or self._driver_waiter.wait(0):
                self._run_cycle()
                continue
            timeout = self._idle_timeout()
            self._driver_waiter.wait(_TICK_SECONDS if timeout is None else min(timeout, _TICK_SECONDS))
            self._drain_wakes(self._driver_wake_r)
            if not self._has_new_work():
                self._check_stalls()

    def _run(self) -> None:
        try:
            self._guarded(self._loop)
        finally:
            self._stopped.set()
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
            self._die(f"Horovod stopped on rank {self.rank}: {exc}. "
                      "The rank named here is the one that failed; look at its output for the cause.")
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
        self._fail_everything(self.fatal)

    def _fail_everything(self, error: BaseException) -> None:
        for state in self.sets.values():
            with state.lock:
                entries = state.new + [e for e, _ in state.unsent.values()] + list(state.waiting.values())
                state.new, state.unsent, state.waiting = [], {}, {}
                state.names.clear()
            for entry in entries:
                entry.finish(error=error)
        for entry in self._executing:
            if entry is not None:
                entry.finish(error=error)

    def _busy(self) -> bool:
        return any(state.unsent or state.waiting for state in self.sets.values())

    def _has_new_work(self) -> bool:
        return ((self._shutdown_requested and not self._shutdown_announced) or self._force_cycle
                or any(state.new for state in self.sets.values()))

    def _cycle_due(self) -> bool:
        """A lone op starts at once; ops arriving while others are in flight are batched for up
        to one cycle time so they can be fused."""
        return self._has_new_work() and (
            not self._busy() or self._shutdown_requested
            or time.monotonic() >= self._last_cycle_start + self.settings.cycle_time_ms / 1000.0)

    def _idle_timeout(self) -> float | None:
        """How long the engine may wait for peers before it has something to do itself."""
        if self._has_new_work():
            return max(0.0, self._last_cycle_start + self.settings.cycle_time_ms / 1000.0 - time.monotonic())
        return _TICK_SECONDS if any(s.has_pending() for s in self.sets.values()) else None

    def _run_cycle(self) -> None:
        if not self._cycle():
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
            peer_started = False
            if timeout != 0:
                peer_started = self._idle_waiter.wait(timeout)
                if peer_started and timeout is None and not self._has_new_work():
                    # A peer started a cycle while we had nothing to submit. Our next op is most
                    # likely being submitted right now by a thread that will wait for it and run
                    # the cycle itself (drive_until); a cycle without it would achieve nothing and
                    # cost another. Give that thread a moment; answer the peer only if none came.
                    last_cycle = self._last_cycle_start
                    select.select([self._wake_r], [], [], _JOIN_GRACE_SECONDS)
                    if self._last_cycle_start != last_cycle:  # a waiting thread ran a cycle
                        continue
            self._drain_wakes(self._wake_r)
            with self._drive:
                if self._finished:
                    return
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
        for state in self.sets.values():
            if any(now - since >= s.stall_check_time_seconds for _, since in state.unsent.values()):
                self._force_cycle = True  # stale cache hits renegotiate so the coordinator sees them
            coordinator = state.coordinator
            if coordinator is None or not coordinator.table:
                continue
            if s.stall_shutdown_time_seconds > 0 and coordinator.stalled(now, s.stall_shutdown_time_seconds):
                self._force_cycle = True
            elif now - state.last_stall_warning >= s.stall_check_time_seconds:
                stalled = coordinator.stalled(now, s.stall_check_time_seconds)
                if stalled:
                    state.last_stall_warning = now
                    log.warning("%s", stall_message(stalled, s.stall_check_time_seconds, False))

    # -- one cycle --------------------------------------------------------------------------
    def _cycle(self) -> bool:
        """Run one lockstep cycle over every set this rank is in; False once the job shuts down."""
        self._last_cycle_start = time.monotonic()
        if self.timeline is not None and self.timeline.active and self.timeline.mark_cycles:
            self.timeline.mark_cycle_start()
        force, self._force_cycle = self._force_cycle, False
        for set_id in sorted(self.sets):
            state = self.sets.get(set_id)
            if state is None or self.rank not in state.members:
                continue
            fatal = self._negotiate_and_run(state, force)
            if fatal:
                self._die(fatal)
                return False
        if self.rank in self._shut_down_ranks:  # our flag went out in this cycle's exchange
            self._shutdown_announced = True
            if not self._wait_for_peers or len(self._shut_down_ranks) == self.transport.size:
                return False
        return True

    def _negotiate_and_run(self, state: SetState, force: bool) -> str:
        """One set's share of the cycle; returns a fatal error message ('' when all is well)."""
        now = time.monotonic()
        with state.lock:
            new, state.new = state.new, []
        join_request = None
        for entry in new:
            if entry.request.op_type == OpType.JOIN:
                join_request = entry.request
                state.joined = True
                state.waiting[entry.name] = entry
            else:
                state.unsent[entry.name] = (entry, now)
        cache = state.cache
        stall_limit = None if self.settings.stall_check_disable else self.settings.stall_check_time_seconds
        hits = invalid = 0
        misses: list[Entry] = []
        hit_bits: dict[str, int] = {}
        for name, (entry, since) in list(state.unsent.items()):
            status, bit = ("miss", -1)
            if cache.enabled and entry.request.op_type in CACHEABLE:
                status, bit = cache.lookup(entry.request)
            if status == "hit" and (stall_limit is None or now - since < stall_limit):
                hits |= 1 << bit
                hit_bits[name] = bit
                continue
            if bit >= 0:
                invalid |= 1 << bit
            misses.append(entry)
        flags = ((_SHUTDOWN if (state.set_id == 0 and self._shutdown_requested) else 0)
                 | (_HAS_UNCACHED if (misses or join_request) else 0)
                 | (_JOINED if state.joined else 0) | (_FORCE_SLOW if force else 0))
        members = state.members
        replies = [wire.decode(p) for p in self.transport.exchange(members, wire.encode((flags, hits, invalid)))]
        all_ones = (1 << cache.num_bits) - 1
        # Joined ranks submit nothing: only the others decide which cached tensors are ready.
        common = all_ones if any(not f & _JOINED for f, _, _ in replies) else 0
        any_invalid, any_flags = 0, 0
        for member, (m_flags, m_hits, m_invalid) in zip(members, replies):
            if not m_flags & _JOINED:
                common &= m_hits
            any_invalid |= m_invalid
            any_flags |= m_flags
            if m_flags & _SHUTDOWN:
                self._shut_down_ranks.add(member)
        gone = self._shut_down_ranks.intersection(members)
        if gone:  # every member sees the same flags, so all of them stop this set together
            with state.lock:
                pending = state.new + [e for e, _ in state.unsent.values()] + list(state.waiting.values())
                state.new, state.unsent, state.waiting = [], {}, {}
                state.names.clear()
            for entry in pending:
                entry.finish(error=self._shutdown_error(gone, entry.name))
            return ""
        if any_invalid:
            common &= ~any_invalid
            for bit in _bits(any_invalid):
                cache.erase_bit(bit)
            for name, bit in list(hit_bits.items()):
                if any_invalid >> bit & 1:
                    misses.append(state.unsent[name][0])
                    del hit_bits[name]
        responses: list[Response] = []
        for bit in _bits(common):
            response = cache.response_for_bit(bit)
            name = response.names[0]
            if name in hit_bits:
                state.waiting[name] = state.unsent.pop(name)[0]
            responses.append(response)
        fatal = ""
        if any_flags & (_HAS_UNCACHED | _FORCE_SLOW) or any_invalid:
            for entry in misses:
                state.unsent.pop(entry.name, None)
                state.waiting[entry.name] = entry
            requests = [e.request.to_wire() for e in misses] + ([join_request.to_wire()] if join_request else [])
            fatal, slow = self._slow_path(state, wire.encode(requests))
            for response in slow:
                if response.op_type in CACHEABLE and not response.error:
                    entry = state.waiting.get(response.names[0])
                    cache.put(response, entry.request.signature() if entry else None)
            responses.extend(slow)
        if fatal:
            return fatal
        for response in plan_fusion(responses, self.settings.fusion_threshold):
            self._execute(state, response)
        return ""

    def _slow_path(self, state: SetState, payload: bytes) -> tuple[str, list[Response]]:
        members, root = state.members, state.members[0]
        gathered = self.transport.gather(members, payload, root)
        answer = None
        if gathered is not None:
            coordinator = state.coordinator
            assert coordinator is not None
            ready: list[str] = []
            for blob in gathered:
                ready.extend(coordinator.add([Request.from_wire(item) for item in wire.decode(blob)]))
            ready.extend(coordinator.ready_after_joins())
            responses = coordinator.build_responses(ready)
            fatal = ""
            limit = self.settings.stall_shutdown_time_seconds
            if limit > 0 and not self.settings.stall_check_disable:
                stalled = coordinator.stalled(time.monotonic(), limit)
                if stalled:
                    fatal = stall_message(stalled, limit, True)
                    log.error("%s", fatal)
            answer = wire.encode((fatal, [r.to_wire() for r in responses]))
        fatal, items = wire.decode(self.transport.bcast_bytes(members, answer, root))
        return fatal, [Response.from_wire(item) for item in items]

    def _execute(self, state: SetState, response: Response) -> None:
        with state.lock:
            entries = [state.waiting.pop(name, None) for name in response.names]
            state.names.difference_update(response.names)
        if response.op_type == OpType.JOIN:
            state.joined = False
        elif response.op_type in (OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET):
            self._change_sets(response, entries)
            return
        self._executing = entries
        self.executor.execute(response, entries, state.members)
        self._executing = []

    def _change_sets(self, response: Response, entries: list[Entry | None]) -> None:
        if response.op_type == OpType.ADD_PROCESS_SET:
            set_id = next(i for i in range(1, len(self.sets) + 2) if i not in self.sets)
            self._register_set(set_id, tuple(response.process_set_ranks))
            result: object = set_id
        else:
            set_id = response.root_rank
            removed = self.sets.pop(set_id, None)
            if removed is not None:
                with removed.lock:
                    pending = removed.new + [e for e, _ in removed.unsent.values()] + list(removed.waiting.values())
                for entry in pending:
                    entry.finish(error=HorovodInternalError(
                        f"process set {set_id} was removed while {entry.name} was pending"))
            result = removed is not None
        for entry in entries:
            if entry is not None:
                entry.finish(result)


def _bits(value: int) -> list[int]:
    """Indices of the set bits of `value`, ascending."""
    bits = []
    while value:
        low = value & -value
        bits.append(low.bit_length() - 1)
        value ^= low
    return bits
