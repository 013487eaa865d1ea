"""Signalling between the ranks of one host: counters in the control blocks, fences, bells.

Progress is published as monotonic counters, one per ordered pair of ranks and kind. A waiting
rank spins briefly (only when every local rank has a core of its own, and only while recent waits
were short: `transport.spin`), then sleeps on a datagram socket (its *bell*); a peer that
publishes what it sleeps on rings it. Each counter is an aligned 8-byte word with a single writer.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Sequence

from horovod.common.transport.base import PeerFailure
from horovod.common.transport.spin import BACKGROUND_SPIN_SECONDS, SPIN_SECONDS, SpinPolicy
from horovod.common.transport.tcp import CLOSED_BY_PEER, HANGUP, TcpTransport

if TYPE_CHECKING:
    from horovod.common.transport.shm.segment import HostSegments

# Header words of the control block. Two threads of a rank may sleep: the one that drives the
# engine (it holds the engine's drive lock) and the idle engine thread; each has its own words.
# WAITING (the driver's): 0 while awake, else what it sleeps on, kind << 16 | (local index of the
# peer + 1), with ANY_PEER for "a message from anyone"; TARGET: the counter value it waits for.
# IDLE (the engine thread's): 1 while it sleeps idle, to be rung on any message, unless DRIVEN
# says a framework thread drives the engine and watches for messages itself.
# BLAME: 1 + the rank our failure report named.
WAITING, CLOSED, BLAME, TARGET, IDLE, DRIVEN = 0, 1, 2, 3, 4, 5
# In the BLAME word, above the blamed rank (+1): the rank's host stopped answering.
BLAMED_UNREACHABLE = 1 << 40
ANY_PEER = 0xFFFF
HEADER_WORDS = 8
IDLE_SUFFIX = ".idle"  # the idle engine thread's bell: the driver's bell address + this
# Counter kinds: one u64 per local peer each, written by the block's owner.
SENT, RECEIVED, STAGED, REDUCED, CONSUMED = range(5)
KINDS = 5

_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier (an atomic read-modify-write under the hood)."""
    _fence_lock.acquire()
    _fence_lock.release()


class Bells:
    """This rank's two bells, abstract datagram sockets named after its segment: one rung for the
    thread that drives the engine, one for the idle engine thread."""

    def __init__(self, name: str) -> None:
        self.driver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.idle = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            for bell, address in ((self.driver, "\0" + name), (self.idle, "\0" + name + IDLE_SUFFIX)):
                bell.bind(address)
                bell.setblocking(False)
        except OSError:
            self.close()
            raise

    def drain(self, idle: bool = False) -> None:
        """Empty a bell (its rings have done their job: we are awake). Each thread drains only its
        own: draining the other's could swallow a ring that its poll has not seen yet."""
        bell = self.idle if idle else self.driver
        try:
            while True:
                bell.recv(64)
        except (BlockingIOError, InterruptedError):
            pass

    def close(self) -> None:
        self.driver.close()
        self.idle.close()


class Signals:
    """Publishing progress to local peers, and waiting for theirs (spin, then sleep on our bell).

    Also the shared-memory side of failure reports: a peer that closed or hung is named through
    the TCP mesh's `DeathWatch` when there is one.
    """

    def __init__(self, host: HostSegments, tcp: TcpTransport, peer_timeout: float, may_spin: bool) -> None:
        self.tcp = tcp
        self.members, self.me, self.index = host.members, host.me, host.index
        self.segments, self.mine = host.mapped, host.mine
        self.bells, self.bell_address = host.bells, host.bell_address
        self.timeout = peer_timeout
        self.may_spin = may_spin  # spinning only helps while every local rank has a core
        self.spin = BACKGROUND_SPIN_SECONDS  # the longest spin now (longer while a caller drives)
        self.own_core = False  # this rank runs on cores of its own (placement bound it)
        self._driven = False
        self._spin_policy = SpinPolicy(may_spin)
        self._poll: select.poll | None = None
        self._fd_rank: dict[int, int] = {}

    # -- publishing ---------------------------------------------------------------------------
    def ring(self, kinds: tuple[int, ...], peers: Sequence[int]) -> None:
        """Wake each listed peer asleep on what we just published (call behind a fence)."""
        me, counters = self.me, self.mine.counters
        for q in peers:
            if q == me:
                continue
            header = self.segments[q].header
            waiting = header[WAITING]
            if waiting:
                on, kind = (waiting & 0xFFFF) - 1, waiting >> 16
                if (on == me and kind in kinds and counters[kind][q] >= header[TARGET]) or (
                        on == ANY_PEER - 1 and SENT in kinds):
                    self.wake(q)
                    continue
            if SENT in kinds and header[IDLE] and not header[DRIVEN]:
                self.wake(q, idle=True)

    def wake(self, q: int, idle: bool = False) -> None:
        try:
            self.bells.driver.sendto(b"\0", self.bell_address[q] + IDLE_SUFFIX if idle else self.bell_address[q])
        except OSError:  # its bell is full (it will wake anyway) or it is gone
            pass

    def publish(self, kind: int, gl: Sequence[int], bases: Sequence[int], value: int) -> None:
        counters, me = self.mine.counters[kind], self.me
        for q, base in zip(gl, bases):
            if q != me:
                counters[q] = base + value
        fence()
        self.ring((kind,), gl)

    def progress(self, gl: Sequence[int], bases: Sequence[int], staged: int, reduced: int, consumed: int) -> None:
        """Publish a round's progress at once (zero: nothing new of that kind)."""
        me, counters = self.me, self.mine.counters
        for kind, value in ((STAGED, staged), (REDUCED, reduced), (CONSUMED, consumed)):
            if value:
                mine = counters[kind]
                for q, base in zip(gl, bases):
                    if q != me:
                        mine[q] = base + value
        fence()
        self.ring((STAGED, REDUCED, CONSUMED), gl)

    # -- waiting ------------------------------------------------------------------------------
    def wait(self, q: int, kind: int, target: int) -> None:
        """Block until local rank q's counter `kind` for us reaches `target`."""
        counter, me = self.segments[q].counters[kind], self.me
        if counter[me] >= target:
            return
        start = time.perf_counter()
        # Offer the core while we spin unless it is ours alone and a caller drives (the engine
        # thread spins beside the framework's compute; unplaced ranks may share a core).
        yield_core = not (self.own_core and self._driven)
        if not self._spin_policy.spin(lambda: counter[me] >= target, self.spin, yield_core):
            self._sleep_until(q, kind, counter, target)
        self._spin_policy.record(time.perf_counter() - start, self.spin)

    def _poller(self) -> select.poll:
        """Our bell, and every connection of the job (a peer that closes wakes us at once)."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.bells.driver, select.POLLIN)
            for r in range(self.tcp.size):
                if r != self.tcp.rank:
                    sock = self.tcp.peer(r).sock
                    self._poll.register(sock, HANGUP)
                    self._fd_rank[sock.fileno()] = r
        return self._poll

    def _sleep_until(self, q: int, kind: int, counter: memoryview, target: int) -> None:
        me, header, poll, deaths = self.me, self.mine.header, self._poller(), self.tcp.deaths
        peer_rank = self.members[q]
        seen, since = counter[me], time.monotonic()
        while True:
            header[TARGET] = target
            header[WAITING] = kind << 16 | (q + 1)
            fence()
            if counter[me] >= target:
                header[WAITING] = 0
                return
            events = poll.poll(1000)
            header[WAITING] = 0
            self.bells.drain()
            if counter[me] >= target:
                return
            for fd, happened in events:
                if fd in self._fd_rank and happened & HANGUP:
                    raise self._failure(self._fd_rank[fd], CLOSED_BY_PEER)
            if deaths is not None and deaths.first is not None:
                raise deaths.blame(deaths.first, CLOSED_BY_PEER)
            if self.segments[q].header[CLOSED]:
                raise self._failure(peer_rank, "shut down while this rank was waiting for it")
            value = counter[me]
            if value != seen:
                seen, since = value, time.monotonic()
            elif time.monotonic() - since > self.timeout:
                raise self._failure(peer_rank, f"made no progress for {self.timeout:.0f} s (hung? HOROVOD_GLOO_TIMEOUT_SECONDS sets this limit)")

    # -- the engine's sleepers ----------------------------------------------------------------
    def set_listening(self, on: bool, driver: bool) -> None:
        """Around a wait for any peer's message: posting one rings our bell. The driver and the
        idle engine thread use different words, so neither clears the other's."""
        self.mine.header[WAITING if driver else IDLE] = (SENT << 16 | ANY_PEER if driver else 1) if on else 0
        if on:
            fence()

    def set_driven(self, on: bool) -> None:
        """A framework thread drives the engine (on) or no longer does: a peer that posts a
        message once it sees the word cleared rings the idle engine thread. No fence: it would
        wait for the peer's core to give up the line it last read (see `ShmActivity`)."""
        self.mine.header[DRIVEN] = int(on)
        self._driven = on
        self.spin = SPIN_SECONDS if on else BACKGROUND_SPIN_SECONDS

    def pending(self) -> bool:
        """True when a local peer has posted a control message we have not read yet."""
        me, received = self.me, self.mine.counters[RECEIVED]
        for q, seg in enumerate(self.segments):  # a plain loop: a generator in any() costs twice (every op asks)
            if q != me and seg.counters[SENT][me] > received[q]:
                return True
        return False

    # -- failures -----------------------------------------------------------------------------
    def attach(self) -> None:
        """Let the TCP mesh's death watch wake our waits and ask whom a local peer blamed."""
        if self.tcp.deaths is not None:
            self.tcp.deaths.listeners.append(self._wake_self)
            self.tcp.deaths.local_cause = self._blamed_by

    def announce_closed(self) -> None:
        """Detach from the death watch, then tell peers we are gone (and whom we blamed)."""
        deaths = self.tcp.deaths
        if deaths is not None:  # its thread must not look into segments we are about to release
            deaths.local_cause = None
            deaths.listeners.clear()
            if deaths.reported is not None:
                deaths.announce()  # the reason first, in the store: a peer that reads BLAME can find it
                # ... and whether its host stopped answering, here too: the store may be cut off as well.
                cut_off = BLAMED_UNREACHABLE if deaths.reported_unreachable else 0
                self.mine.header[BLAME] = (deaths.reported + 1) | cut_off
        self.mine.header[CLOSED] = 1
        fence()
        for q in range(len(self.members)):
            if q != self.me:
                self.wake(q)
                self.wake(q, idle=True)

    def _wake_self(self) -> None:
        """Called by the TCP mesh's death watch: a connection closed, stop waiting."""
        self.wake(self.me)

    def _blamed_by(self, rank: int) -> tuple[int, bool] | None:
        """Whom local `rank` named when it failed (itself if it named nobody), and whether it said
        that rank's host stopped answering; None if `rank` is not local."""
        q = self.index.get(rank)
        try:
            word = self.segments[q].header[BLAME] if q is not None else None
        except (TypeError, IndexError):  # released meanwhile (we are closing)
            return None
        if word is None:
            return None
        blamed = word & ~BLAMED_UNREACHABLE
        return (blamed - 1 if blamed else rank), bool(word & BLAMED_UNREACHABLE)

    def _failure(self, rank: int, reason: str) -> PeerFailure:
        deaths = self.tcp.deaths
        return deaths.blame(rank, reason) if deaths is not None else PeerFailure(rank, reason)

