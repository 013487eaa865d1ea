"""One negotiation cycle: what every rank does, in lockstep, each time the engine runs.

For every process set this rank belongs to, in id order: the fast-path exchange of bit vectors
(decided by `readiness.agree`; a lone small allreduce's data goes with it), the slow path
through the set's coordinator when some member needs it, then the fusion plan and the execution
of the agreed responses, or a change of the process sets themselves. Which thread runs a cycle,
and when, is the driver's business.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

from horovod.common import wire
from horovod.common.engine.autotune import Autotuner
from horovod.common.engine.blocking import BlockedWaits
from horovod.common.engine.coordinator import deadlock_message, stall_message
from horovod.common.engine.executor import Executor
from horovod.common.engine.fusion import plan_fusion
from horovod.common.engine.handles import Entry
from horovod.common.engine.messages import CACHEABLE, OpType, Request, Response, is_anonymous
from horovod.common.engine.readiness import (BLOCKED, EAGER, FAILED, FORCE_SLOW, HAS_UNCACHED, JOINED, SHUTDOWN,
                                              agree, bits, decode_status, encode_status)
from horovod.common.engine.state import SetState, ShutdownState
from horovod.common.engine.tunables import Tunables
from horovod.common.exceptions import HorovodInternalError
from horovod.common.logging import log
from horovod.common.reduce_ops import Adasum, scale_in_place
from horovod.common.settings import Settings
from horovod.common.transport.base import Transport

if TYPE_CHECKING:
    from horovod.common.timeline import Timeline

_SET_CHANGES = frozenset((OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET))
# The op types a cycle tests every op against (reading an enum member costs 60 ns on Python 3.11).
_JOIN, _ALLREDUCE = OpType.JOIN, OpType.ALLREDUCE
# Flagless status messages kept encoded, by ready bits: a training step's cycles repeat a few.
_PLAIN_STATUSES_KEPT = 256


class Cycle:
    """Runs cycles over the process sets in `sets`: the dict the engine submits to, which a cycle
    itself changes when the job adds or removes a process set."""

    def __init__(self, settings: Settings, transport: Transport, timeline: Timeline | None,
                 sets: dict[int, SetState], shutdown: ShutdownState, on_fatal: Callable[[str], None],
                 blocked: BlockedWaits) -> None:
        self.settings = settings
        self.transport = transport
        self.rank = transport.rank
        self.timeline = timeline
        self.executor = Executor(transport, settings, self.timeline)
        # A lone ready allreduce this small (its bytes times the set's size) travels inside the
        # status message. When every member sends the same status with its contribution, each
        # reduces them all itself: one round trip between the ranks for the op instead of two
        # (negotiation, then the transport's allreduce).
        self._eager_bytes = transport.eager_bytes
        self.sets = sets
        self.shutdown = shutdown
        self._on_fatal = on_fatal  # a coordinator's fatal decision (stall shutdown) ends the engine
        self.blocked = blocked  # what this rank's threads are stuck waiting for
        self.forced = False  # the next cycle is due now and takes the slow path (stalled work)
        # Stalled cache hits go to the coordinator after this long (None: stall checks are off).
        self._stall_limit = None if settings.stall_check_disable else settings.stall_check_time_seconds
        self.last_start = 0.0
        self._mine: list[SetState] = []  # see _order_sets
        self._plain_statuses: dict[int, bytes] = {}  # see _PLAIN_STATUSES_KEPT
        self.executing: list[Entry | None] = []  # failed too if the engine dies mid-operation
        # The knobs in force (autotune changes them at a cycle's end, on every rank at once).
        self.tunables = Tunables.from_settings(settings)
        self.autotuner = (Autotuner(settings.autotune, self.tunables, transport.tunable_knobs, self.rank)
                          if settings.autotune.enabled else None)

    def register_set(self, set_id: int, members: tuple[int, ...]) -> None:
        self.sets[set_id] = SetState.for_members(set_id, members, self.rank, self.settings.cache_capacity,
                                                 self.timeline)
        self._order_sets()

    def _order_sets(self) -> None:
        """The sets this rank is a member of, in id order: what every cycle walks."""
        self._mine = [state for _, state in sorted(self.sets.items()) if self.rank in state.members]

    def run(self) -> bool:
        """Run one lockstep cycle over every set this rank is in; False once the job shuts down."""
        self.last_start = time.monotonic()
        if self.timeline is not None and self.timeline.active and self.timeline.mark_cycles:
            self.timeline.mark_cycle_start()
        force, self.forced = self.forced, False
        sets = self.sets
        for state in self._mine:
            if sets.get(state.set_id) is not state:  # removed earlier in this cycle
                continue
            fatal = self._negotiate_and_run(state, force)
            if fatal:
                self._on_fatal(fatal)
                return False
        if self.autotuner is not None and self.autotuner.sample_closed():
            self._sync_tunables()
        shutdown = self.shutdown
        if shutdown.requested and self.rank in shutdown.ranks:  # our flag went out in this cycle's exchange
            shutdown.announced = True
            if not shutdown.wait_for_peers or len(shutdown.ranks) == self.transport.size:
                return False
        return True

    def _negotiate_and_run(self, state: SetState, force: bool) -> str:
        """One set's share of the cycle; returns a fatal error message ('' when all is well)."""
        now = self.last_start
        unsent = state.unsent
        join_request = None
        if state.new:
            with state.lock:
                new, state.new = state.new, []
            for entry in new:
                request = entry.request
                if request.op_type == _JOIN:
                    join_request = request
                    state.joined = True
                    state.waiting[request.name] = entry
                else:
                    unsent[request.name] = (entry, now)
        cache = state.cache
        stall_limit = self._stall_limit
        hits = invalid = 0
        misses: list[Entry] = []
        hit_bits: dict[str, int] = {}
        use_cache = cache.enabled and self.tunables.cache_enabled
        for name, (entry, since) in unsent.items():
            status, bit = ("miss", -1)
            if use_cache and entry.request.op_type in CACHEABLE:
                status, bit = cache.lookup(entry.request)
            if status == "hit" and (stall_limit is None or now - since < stall_limit):
                hits |= 1 << bit
                hit_bits[name] = bit
                continue
            if bit >= 0:
                invalid |= 1 << bit
            misses.append(entry)
        waits = [] if stall_limit is None else self.blocked.waits(state.set_id, now)
        leaving = state.set_id == 0 and self.shutdown.requested
        flags = (((SHUTDOWN | (FAILED if self.shutdown.failing else 0)) if leaving else 0)
                 | (HAS_UNCACHED if (misses or join_request) else 0)
                 | (JOINED if state.joined else 0) | (FORCE_SLOW if force else 0) | (BLOCKED if waits else 0))
        message = (flags, hits, invalid, waits)
        eager = None
        if not flags and len(hit_bits) == 1 and not misses and self._eager_bytes:
            contribution = self._eager_contribution(next(iter(unsent.values()))[0],
                                                    self._eager_bytes // len(state.members))
            if contribution is not None:
                message = (EAGER, hits, 0, waits)
                eager = self._payload(message)
                payload = eager + contribution
        if eager is None:
            payload = self._payload(message)
        received = self.transport.exchange(state.members, payload)
        return self._conclude(state, message, payload, received, misses, hit_bits, join_request, eager)

    def _payload(self, message: tuple[int, int, int, list[str]]) -> bytes:
        """The status message on the wire; one with no flag but EAGER (the steady state: only
        ready bits, no stale bits, no waits) is encoded once per set of ready bits. An EAGER
        status is padded to 8 bytes, so that the contribution after it is aligned."""
        flags, hits = message[0], message[1]
        if flags & ~EAGER:
            return encode_status(*message)
        key = (flags, hits)
        payload = self._plain_statuses.get(key)
        if payload is None:
            if len(self._plain_statuses) >= _PLAIN_STATUSES_KEPT:
                self._plain_statuses.clear()
            payload = encode_status(*message)
            if flags:
                payload += bytes(-len(payload) % 8)
            self._plain_statuses[key] = payload
        return payload

    @staticmethod
    def _eager_contribution(entry: Entry, limit: int) -> bytes | None:
        """What this rank adds to its lone ready op, to send with its status, if that op is an
        allreduce in host memory of at most `limit` bytes; prescaled, as the transport's
        allreduce would see it."""
        request, tensor = entry.request, entry.tensor
        if (request.op_type != _ALLREDUCE or request.reduce_op == Adasum or request.device >= 0
                or tensor is None or tensor.nbytes > limit):
            return None
        if request.prescale == 1.0:
            return tensor.tobytes()
        scaled = tensor.reshape(-1).copy()
        scale_in_place(scaled, request.prescale)
        return scaled.tobytes()

    def _conclude(self, state: SetState, message: tuple[int, int, int, list[str]], payload: bytes,
                  received: list[bytes], misses: list[Entry], hit_bits: dict[str, int],
                  join_request: Request | None, eager: bytes | None) -> str:
        """Decide from every member's status what the set runs this cycle, and run it; returns a
        fatal error message ('' when all is well). `hit_bits` are this rank's cache hits by name
        (their entries wait in `state.unsent`), `misses` its entries for the coordinator; `eager`
        the status this rank sent before its contribution, if it sent one."""
        flags, hits = message[0], message[1]
        members = state.members
        cache = state.cache
        replies: Sequence[tuple] = ()
        gathered = None
        if not flags and received.count(payload) == len(received):
            # Every member sent our flagless status: what `agree` would decide from it, without
            # decoding one message per peer (the steady state of training, every cycle).
            ready, stale, slow_path, shut_down = bits(hits), (), False, ()
        elif eager is not None and _all_alike(received, eager, len(payload)):
            # Every member sent our status and a contribution to the same lone op (its one bit):
            # run it from them.
            ready, stale, slow_path, shut_down = [hits.bit_length() - 1], (), False, ()
            gathered = (received, len(eager))
        else:
            # Our own payload comes back as the very object sent (where the transport does so):
            # its message is at hand, not decoded again.
            replies = [message if p is payload else decode_status(p) for p in received]
            ready, stale, slow_path, shut_down = agree(members, replies, cache.num_bits)
        if shut_down:
            self.shutdown.ranks.update(shut_down)
            self.shutdown.failed.update(m for m, reply in zip(members, replies) if reply[0] & FAILED)
        gone = self.shutdown.ranks.intersection(members) if self.shutdown.ranks else None
        if gone:  # every member sees the same flags, so all of them stop this set together
            for entry in state.take_pending():
                entry.finish(error=self.shutdown.error(gone, entry.name))
            return ""
        if stale:
            for bit in stale:
                cache.erase_bit(bit)
            for name, bit in list(hit_bits.items()):
                if bit in stale:
                    misses.append(state.unsent[name][0])
                    del hit_bits[name]
        responses: list[Response] = []
        unsent, waiting = state.unsent, state.waiting
        for bit in ready:
            response = cache.response_for_bit(bit)
            name = response.names[0]
            if name in hit_bits:
                waiting[name] = unsent.pop(name)[0]
            responses.append(response)
        fatal = ""
        if slow_path:
            for entry in misses:
                state.unsent.pop(entry.name, None)
                state.waiting[entry.name] = entry
            requests = [e.request.to_wire() for e in misses] + ([join_request.to_wire()] if join_request else [])
            fatal, slow = self._slow_path(state, wire.encode(requests))
            for response in slow:
                if (response.op_type in CACHEABLE and not response.error and self.tunables.cache_enabled
                        and not is_anonymous(response.names[0])):
                    entry = state.waiting.get(response.names[0])
                    cache.put(response, entry.request if entry else None)
            responses.extend(slow)
        if fatal:
            return fatal
        # Deadlock: every member is stuck and no op is awaited by all of them (one that is, every
        # member has submitted, so it will run: negotiation is merely slow, e.g. a loaded machine).
        if (not responses and replies and all(reply[0] & BLOCKED for reply in replies)
                and not set.intersection(*(set(reply[3]) for reply in replies))):
            self._fail_deadlock(state, {m: reply[3] for m, reply in zip(members, replies)})
            return ""
        tuner = self.autotuner if state.set_id == 0 else None
        for response in (responses if len(responses) < 2 else plan_fusion(responses, self.tunables.fusion_threshold)):
            self._execute(state, response, gathered)
            if tuner is not None:
                tuner.record(response)
        return ""

    def _fail_deadlock(self, state: SetState, waits: dict[int, list[str]]) -> None:
        """Every member is stuck waiting and nothing became ready: nothing ever will. Every member
        decides this in the same cycle from the same messages and fails all of the set's pending
        ops, so each rank raises, and the set is clean for whatever the script does next."""
        error = deadlock_message(state.set_id, waits)
        log.error("%s", error)
        if state.coordinator is not None:
            state.coordinator.table.clear()
        for entry in state.take_pending():
            entry.finish(error=HorovodInternalError(error))

    def _sync_tunables(self) -> None:
        """A sample closed (on every rank, this cycle): rank 0 decides, everyone applies."""
        tuner = self.autotuner
        assert tuner is not None
        payload = None
        if self.rank == 0:
            active, knobs = tuner.decide()
            payload = (b"1" if active else b"0") + knobs.to_wire()
        else:
            tuner.reset_sample()
        data = self.transport.bcast_bytes(self.sets[0].members, payload, 0)
        was_caching = self.tunables.cache_enabled
        self.tunables = Tunables.from_wire(data[1:])
        self.tunables.apply_to(self.transport)
        if self.tunables.cache_enabled and not was_caching:
            # While the cache was off, a rank may have sent a tensor to the coordinator that another
            # rank has not submitted yet; found in the cache, the latter would offer it as a hit,
            # which the former never will, and both would wait until the stall limit. Starting from
            # an empty cache, every tensor goes through the coordinator once more.
            for state in self.sets.values():
                state.cache.clear()
        if data[:1] == b"0":
            self.autotuner = None

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

    def _execute(self, state: SetState, response: Response,
                 gathered: tuple[list[bytes], int] | None = None) -> None:
        names = response.names
        with state.lock:
            if len(names) == 1:  # no list comprehension for the usual lone tensor: it costs a call
                entries = [state.waiting.pop(names[0], None)]
                state.names.discard(names[0])
            else:
                entries = [state.waiting.pop(name, None) for name in names]
                state.names.difference_update(names)
        if response.op_type == _JOIN:
            state.joined = False
        elif response.op_type in _SET_CHANGES:
            self._change_sets(response, entries)
            return
        self.executing = entries
        self.executor.execute(response, entries, state.members, gathered)
        self.executing = []

    def _change_sets(self, response: Response, entries: list[Entry | None]) -> None:
        if response.op_type == OpType.ADD_PROCESS_SET:
            set_id = next(i for i in range(1, len(self.sets) + 2) if i not in self.sets)
            self.register_set(set_id, tuple(response.process_set_ranks))
            result: object = set_id
        else:
            set_id = response.root_rank
            removed = self.sets.pop(set_id, None)
            self._order_sets()
            if removed is not None:
                for entry in removed.take_pending():
                    entry.finish(error=HorovodInternalError(
                        f"process set {set_id} was removed while {entry.name} was pending"))
            result = removed is not None
        for entry in entries:
            if entry is not None:
                entry.finish(result)


def _all_alike(received: list[bytes], status: bytes, size: int) -> bool:
    """Whether every message is `status` and a contribution of the same size as this rank's
    (a plain loop: a generator costs a microsecond here, on every small op)."""
    for message in received:
        if len(message) != size or not message.startswith(status):
            return False
    return True
