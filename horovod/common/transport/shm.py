"""Same-host transport: ranks on one machine move data through shared memory.

Every rank owns one segment, a file in /dev/shm that is unlinked as soon as every local peer has
mapped it, so nothing is left behind however the job ends (normal exit, `shutdown()`, a crash,
SIGKILL). A segment holds, in this order:

    control block  counters the owner writes and its peers read (below)
    channels       two mailboxes per peer for control messages (negotiation)
    slots          DEPTH staging slots for the data plane, small enough that data handed from
                   one rank to another stays in the shared cache
    fusion region  the engine's fusion buffer (`fusion_buffer`): peers read tensors packed there
                   in place, so packing is the only copy

Data plane. A collective runs in *rounds*. In round r a rank stages, into its slot r % DEPTH, the
r-th piece of what its peers need, and reads what it needs from theirs, one round behind, so
staging and reading overlap. Allreduce:
- two members: each stages its buffer and reduces the other's staged copy into its own. The
  operations are commutative, so both hold the same bits; this is as much memory traffic as
  slicing, in fewer steps.
- more members, or a buffer in the fusion region: every member owns one slice; it reduces its
  slice's piece from every peer (reading a fusion-region buffer in place), publishes the result,
  and copies the others' reduced pieces. Work and traffic split evenly.
- up to SMALL_ALLREDUCE_BYTES: everyone stages the whole buffer once and reduces all of it, in
  member order, so every rank computes the same bits with a single synchronisation.

Signalling. Progress is published as monotonic counters, one per ordered pair of ranks and kind.
Both ranks of a pair run the same collectives in the same order and agree on how many rounds each
takes, so no counter needs to say which collective it belongs to. A waiting rank spins briefly
(only when every local rank has a core of its own, and not while spins keep failing), then
sleeps on a datagram socket; a peer that publishes what it sleeps on rings it. The TCP mesh stays
up underneath: a peer that dies closes its connections, which wakes every waiter, and
`tcp.DeathWatch` names the rank that failed first.

Ordering relies on stores becoming visible in program order (x86-64 and the fences below); each
counter is an aligned 8-byte word with a single writer.
"""

from __future__ import annotations

import math
import mmap
import os
import secrets
import select
import socket
import sys
import threading
import time
from typing import Sequence

import numpy as np

from horovod.common import wire
from horovod.common.logging import log
from horovod.common.reduce_ops import reduce_into
from horovod.common.transport.base import PeerFailure, Transport, TransportContext
from horovod.common.transport.tcp import CLOSED_BY_PEER, HANGUP, TcpTransport

SHM_DIR = "/dev/shm"
_PREFIX = "khvd-"
_PAGE = mmap.PAGESIZE
# An allreduce round moves PIECE_BYTES per member through a staging slot of n pieces (other
# collectives use the whole slot). Measured here: 256 KiB keeps a round's data in the core's L2;
# larger pieces lose more to cache misses than they save in per-round overhead.
PIECE_BYTES = 256 * 1024
MIN_SLOT_BYTES = 512 * 1024
DEPTH = 4
# One control mailbox; larger control messages travel over the TCP connection instead.
CHANNEL_BYTES = 64 * 1024
# Up to this size an allreduce stages the whole buffer once and every rank reduces all of it.
SMALL_ALLREDUCE_BYTES = 64 * 1024
SPIN_SECONDS = 20e-6
# While a framework thread drives the engine (it would only block otherwise) it spins longer: a
# rank that sleeps takes 30-60 us to wake here, more than the whole small op.
DRIVER_SPIN_SECONDS = 200e-6
_VIA_TCP = 1 << 63

# Header words of the control block. Two threads of a rank may sleep: the one that drives the
# engine (it holds the engine's drive lock) and the idle engine thread; each has its own words.
# _WAITING (the driver's): 0 while awake, else what it sleeps on, kind << 16 | (local index of the
# peer + 1), with _ANY_PEER for "a message from anyone"; _TARGET: the counter value it waits for.
# _IDLE (the engine thread's): 1 while it sleeps idle, to be rung on any message, unless _DRIVEN
# says a framework thread drives the engine and watches for messages itself.
# _BLAME: 1 + the rank our failure report named.
_WAITING, _CLOSED, _BLAME, _TARGET, _IDLE, _DRIVEN = 0, 1, 2, 3, 4, 5
_ANY_PEER = 0xFFFF
_IDLE_SUFFIX = ".idle"  # the idle engine thread's bell: the driver's bell address + this
# After this many spins in a row that found nothing, skip spinning for a while (the machine is busy).
_SPIN_MISSES, _SPIN_PAUSE = 8, 64
_HEADER_WORDS = 8
# Counter kinds: one u64 per local peer each, written by the block's owner.
SENT, RECEIVED, STAGED, REDUCED, CONSUMED = range(5)
_KINDS = 5

_fence_lock = threading.Lock()


def _fence() -> None:
    """A full memory barrier (an atomic read-modify-write under the hood)."""
    _fence_lock.acquire()
    _fence_lock.release()


def _round_up(value: int, to: int = _PAGE) -> int:
    return (value + to - 1) // to * to


def _even_counts(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def _offsets(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for count in counts:
        out.append(acc)
        acc += int(count)
    return out


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


class Unavailable(RuntimeError):
    """Shared memory cannot be used here; the caller falls back to TCP."""


class _Layout:
    """Byte offsets inside a segment for `local_size` ranks and a fusion region of `fusion` bytes."""

    def __init__(self, local_size: int, fusion: int) -> None:
        self.header_bytes = 8 * _HEADER_WORDS
        self.counters = self.header_bytes
        self.slot_desc = self.counters + 8 * _KINDS * local_size
        self.channels = _round_up(self.slot_desc + 8 * DEPTH)
        self.slots = self.channels + 2 * CHANNEL_BYTES * local_size
        self.slot_bytes = max(MIN_SLOT_BYTES, PIECE_BYTES * local_size)
        self.fusion = self.slots + DEPTH * self.slot_bytes
        self.fusion_bytes = fusion
        self.fixed = self.fusion
        self.total = self.fusion + fusion


class _Mapped:
    """One rank's segment as seen from this process: counters, channels, slots, fusion region."""

    def __init__(self, fd: int, layout: _Layout, local_size: int, writable: bool) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.mm = mmap.mmap(fd, layout.total, mmap.MAP_SHARED, prot)
        view = memoryview(self.mm)
        self.header = view[: layout.header_bytes].cast("Q")
        self.counters = [view[layout.counters + 8 * local_size * k: layout.counters + 8 * local_size * (k + 1)]
                         .cast("Q") for k in range(_KINDS)]
        self.slot_desc = view[layout.slot_desc: layout.slot_desc + 8 * DEPTH].cast("Q")
        data = np.frombuffer(self.mm, np.uint8)
        size = layout.slot_bytes
        self.slots = [data[layout.slots + s * size: layout.slots + (s + 1) * size] for s in range(DEPTH)]
        self.fusion = data[layout.fusion: layout.fusion + layout.fusion_bytes]
        # Channel q of this segment carries messages from its owner to local rank q.
        self.channel_len = []
        self.channel_data = []
        for q in range(local_size):
            base = layout.channels + 2 * CHANNEL_BYTES * q
            self.channel_len.append([view[base + s * CHANNEL_BYTES: base + s * CHANNEL_BYTES + 8].cast("Q")
                                     for s in range(2)])
            self.channel_data.append([view[base + s * CHANNEL_BYTES + 8: base + (s + 1) * CHANNEL_BYTES]
                                      for s in range(2)])

    def release(self) -> None:
        """Drop our references; the mapping goes when the last numpy view of it does."""
        self.header = self.slot_desc = None  # type: ignore[assignment]
        self.counters, self.slots, self.channel_len, self.channel_data = [], [], [], []
        self.fusion = None  # type: ignore[assignment]
        try:
            self.mm.close()
        except BufferError:  # a view (e.g. the executor's fusion buffer) is still alive
            pass


def _remove_stale_segments() -> None:
    """Unlink segments that crashed jobs of ours left behind (their creator pid is gone)."""
    uid = os.getuid()
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        try:
            pid = int(name[len(_PREFIX):].split("-", 1)[0])
            path = os.path.join(SHM_DIR, name)
            if os.stat(path).st_uid != uid:
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
            except OSError:
                pass
        except (ValueError, OSError):
            continue


class SharedMemory:
    """Collectives and control messages among the ranks of one host (`members`, sorted global ranks).

    Built collectively: every member constructs it at the same time. Raises `Unavailable` (on every
    member alike) when shared memory cannot be set up, so the caller can fall back to TCP.
    """

    def __init__(self, tcp: TcpTransport, members: Sequence[int], rank: int, fusion_bytes: int,
                 peer_timeout: float) -> None:
        self.tcp = tcp
        self.members = list(members)
        self.rank = rank
        self.me = self.members.index(rank)
        self.index = {r: i for i, r in enumerate(self.members)}
        self.timeout = peer_timeout
        local = len(self.members)
        self.layout = _Layout(local, _round_up(max(0, fusion_bytes)))
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self._may_spin = local <= cpus  # spinning only helps while every local rank has a core
        self.spin = SPIN_SECONDS if self._may_spin else 0.0
        self._spin_misses = self._spin_pause = 0
        self.rounds = [0] * local  # rounds completed with each peer
        self.slot_readers: list[list[tuple[int, int]]] = [[] for _ in range(DEPTH)]
        self._groups: dict[tuple[int, ...], tuple[list[int], int]] = {}
        self._fd = -1
        self._path: str | None = None
        self._bell: socket.socket | None = None  # rung for the thread that drives the engine
        self._idle_bell: socket.socket | None = None  # rung for the idle engine thread
        self.segments: list[_Mapped] = []
        self._fusion_reserved = 0
        self._fusion_limit = self.layout.fusion_bytes
        self._poll: select.poll | None = None
        self._fd_rank: dict[int, int] = {}
        self._typed_views: dict[np.dtype, list] = {}
        self.mine: _Mapped | None = None
        self._closed = False
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    # -- setup ------------------------------------------------------------------------------
    def _setup(self) -> None:
        me, layout = self.me, self.layout
        _remove_stale_segments()
        info: tuple = ("", "", 0)
        try:
            name = f"{_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
            self._path = os.path.join(SHM_DIR, name)
            self._fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(self._fd, layout.total)
            os.posix_fallocate(self._fd, 0, layout.fixed)
            self._bell, self._idle_bell = (socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2))
            for bell, address in ((self._bell, "\0" + name), (self._idle_bell, "\0" + name + _IDLE_SUFFIX)):
                bell.bind(address)
                bell.setblocking(False)
            info = ("ok", name, layout.fusion_bytes)
        except OSError as exc:
            info = (f"could not create a {layout.fixed >> 20} MiB segment in {SHM_DIR}: {exc}", "", 0)
        everyone = [wire.decode(p) for p in self.tcp.exchange(self.members, wire.encode(info))]
        problems = [f"rank {self.members[q]}: {status}" for q, (status, _, _) in enumerate(everyone) if status != "ok"]
        if problems:
            raise Unavailable("; ".join(problems))
        if any(fusion != layout.fusion_bytes for _, _, fusion in everyone):
            raise Unavailable("ranks disagree on HOROVOD_FUSION_THRESHOLD")
        self.bell_address = ["\0" + name for _, name, _ in everyone]
        status = "ok"
        try:
            for q, (_, name, _) in enumerate(everyone):
                if q == me:
                    self.segments.append(_Mapped(self._fd, layout, len(self.members), writable=True))
                    continue
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
                try:
                    self.segments.append(_Mapped(fd, layout, len(self.members), writable=False))
                finally:
                    os.close(fd)
        except OSError as exc:
            status = f"could not map a peer's segment: {exc} (is {SHM_DIR} shared between them?)"
        answers = [p.decode() for p in self.tcp.exchange(self.members, status.encode())]
        # Everyone has mapped everyone (or given up): the names are no longer needed.
        self._unlink()
        problems = [f"rank {self.members[q]}: {a}" for q, a in enumerate(answers) if a != "ok"]
        if problems:
            raise Unavailable("; ".join(problems))
        self.mine = self.segments[me]
        if self.tcp.deaths is not None:
            self.tcp.deaths.listeners.append(self._wake_self)
            self.tcp.deaths.local_cause = self._blamed_by
        self._fusion_addr = _address(self.mine.fusion) if layout.fusion_bytes else 0

    def _unlink(self) -> None:
        if self._path is not None:
            try:
                os.unlink(self._path)
            except OSError:
                pass
            self._path = None

    def close(self) -> None:
        """Tell peers we are gone, release the mappings. Safe to call twice, from any thread."""
        if self._closed:
            return
        self._closed = True
        self._unlink()
        deaths = self.tcp.deaths
        if deaths is not None:  # its thread must not look into segments we are about to release
            deaths.local_cause = None
            deaths.listeners.clear()
        if self.mine is not None:
            if deaths is not None and deaths.reported is not None:
                self.mine.header[_BLAME] = deaths.reported + 1
            self.mine.header[_CLOSED] = 1
            _fence()
            for q in range(len(self.members)):
                if q != self.me:
                    self._wake(q)
                    self._wake(q, idle=True)
        for bell in (self._bell, self._idle_bell):
            if bell is not None:
                bell.close()
        self._typed_views.clear()
        for seg in self.segments:
            seg.release()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # -- signalling -------------------------------------------------------------------------
    def _ring(self, kinds: tuple[int, ...], peers: Sequence[int]) -> None:
        """Wake each listed peer asleep on what we just published (call behind a fence)."""
        me, counters = self.me, self.mine.counters
        for q in peers:
            if q == me:
                continue
            header = self.segments[q].header
            waiting = header[_WAITING]
            if waiting:
                on, kind = (waiting & 0xFFFF) - 1, waiting >> 16
                if (on == me and kind in kinds and counters[kind][q] >= header[_TARGET]) or (
                        on == _ANY_PEER - 1 and SENT in kinds):
                    self._wake(q)
                    continue
            if SENT in kinds and header[_IDLE] and not header[_DRIVEN]:
                self._wake(q, idle=True)

    def _wake(self, q: int, idle: bool = False) -> None:
        try:
            self._bell.sendto(b"\0", self.bell_address[q] + _IDLE_SUFFIX if idle else self.bell_address[q])
        except OSError:  # its bell is full (it will wake anyway) or it is gone
            pass

    def _publish(self, kind: int, gl: Sequence[int], bases: Sequence[int], value: int) -> None:
        counters, me = self.mine.counters[kind], self.me
        for q, base in zip(gl, bases):
            if q != me:
                counters[q] = base + value
        _fence()
        self._ring((kind,), gl)

    def _progress(self, gl: Sequence[int], bases: Sequence[int], staged: int, reduced: int, consumed: int) -> None:
        """Publish a round's progress at once (zero: nothing new of that kind)."""
        me, counters = self.me, self.mine.counters
        for kind, value in ((STAGED, staged), (REDUCED, reduced), (CONSUMED, consumed)):
            if value:
                mine = counters[kind]
                for q, base in zip(gl, bases):
                    if q != me:
                        mine[q] = base + value
        _fence()
        self._ring((STAGED, REDUCED, CONSUMED), gl)

    def _typed(self, dtype: np.dtype) -> list[tuple[list[np.ndarray], np.ndarray]]:
        """Per local rank: its slots and its fusion region as arrays of `dtype` (made once per dtype)."""
        views = self._typed_views.get(dtype)
        if views is None:
            views = self._typed_views[dtype] = [([slot.view(dtype) for slot in seg.slots], seg.fusion.view(dtype))
                                                for seg in self.segments]
        return views


    def _wait(self, q: int, kind: int, target: int) -> None:
        """Block until local rank q's counter `kind` for us reaches `target`."""
        counter, me = self.segments[q].counters[kind], self.me
        if counter[me] >= target:
            return
        if self.spin and not self._spin_pause:
            end = time.perf_counter() + self.spin
            while time.perf_counter() < end:
                if counter[me] >= target:
                    self._spin_misses = 0
                    return
            self._spin_misses += 1
            if self._spin_misses >= _SPIN_MISSES:
                self._spin_misses, self._spin_pause = 0, _SPIN_PAUSE
        elif self._spin_pause:
            self._spin_pause -= 1
        self._sleep_until(q, kind, counter, target)

    def _wake_self(self) -> None:
        """Called by the TCP mesh's death watch: a connection closed, stop waiting."""
        self._wake(self.me)

    def _blamed_by(self, rank: int) -> int | None:
        """Whom local `rank` named when it failed (itself if it named nobody); None if not local."""
        q = self.index.get(rank)
        try:
            blamed = self.segments[q].header[_BLAME] if q is not None else None
        except (TypeError, IndexError):  # released meanwhile (we are closing)
            return None
        if blamed is None:
            return None
        return blamed - 1 if blamed else rank

    def _failure(self, rank: int, reason: str) -> PeerFailure:
        deaths = self.tcp.deaths
        return deaths.blame(rank, reason) if deaths is not None else PeerFailure(rank, reason)

    def _poller(self) -> select.poll:
        """Our bell, and every connection of the job (a peer that closes wakes us at once)."""
        if self._poll is None:
            self._poll = select.poll()
            self._poll.register(self.bell, select.POLLIN)
            for r in range(self.tcp.size):
                if r != self.rank:
                    sock = self.tcp.peer(r).sock
                    self._poll.register(sock, HANGUP)
                    self._fd_rank[sock.fileno()] = r
        return self._poll

    def _sleep_until(self, q: int, kind: int, counter: memoryview, target: int) -> None:
        me, header, poll, deaths = self.me, self.mine.header, self._poller(), self.tcp.deaths
        peer_rank = self.members[q]
        seen, since = counter[me], time.monotonic()
        while True:
            header[_TARGET] = target
            header[_WAITING] = kind << 16 | (q + 1)
            _fence()
            if counter[me] >= target:
                header[_WAITING] = 0
                return
            events = poll.poll(1000)
            header[_WAITING] = 0
            self.drain()
            if counter[me] >= target:
                return
            for fd, happened in events:
                if fd in self._fd_rank and happened & HANGUP:
                    raise self._failure(self._fd_rank[fd], CLOSED_BY_PEER)
            if deaths is not None and deaths.first is not None:
                raise deaths.blame(deaths.first, CLOSED_BY_PEER)
            if self.segments[q].header[_CLOSED]:
                raise self._failure(peer_rank, "shut down while this rank was waiting for it")
            value = counter[me]
            if value != seen:
                seen, since = value, time.monotonic()
            elif time.monotonic() - since > self.timeout:
                raise self._failure(peer_rank, f"made no progress for {self.timeout:.0f} s (hung?)")

    def set_listening(self, on: bool, driver: bool) -> None:
        """Around a wait for any peer's message: posting one rings our bell. The driver and the
        idle engine thread use different words, so neither clears the other's."""
        self.mine.header[_WAITING if driver else _IDLE] = (SENT << 16 | _ANY_PEER if driver else 1) if on else 0
        if on:
            _fence()

    def set_driven(self, on: bool) -> bool:
        """A framework thread drives the engine (on) or no longer does; when it stops, True if a
        message arrived meanwhile that nobody has read (the engine thread must be woken)."""
        self.mine.header[_DRIVEN] = int(on)
        if self._may_spin:
            self.spin = DRIVER_SPIN_SECONDS if on else SPIN_SECONDS
        if on:
            return False
        _fence()
        return self.pending()

    @property
    def bell(self) -> socket.socket:
        assert self._bell is not None
        return self._bell

    @property
    def idle_bell(self) -> socket.socket:
        assert self._idle_bell is not None
        return self._idle_bell

    def drain(self, idle: bool = False) -> None:
        """Empty a bell (its rings have done their job: we are awake). Each thread drains only its
        own: draining the other's could swallow a ring that its poll has not seen yet."""
        try:
            while True:
                (self.idle_bell if idle else self.bell).recv(64)
        except (BlockingIOError, InterruptedError):
            pass

    def pending(self) -> bool:
        """True when a local peer has posted a control message we have not read yet."""
        me, received = self.me, self.mine.counters[RECEIVED]
        return any(seg.counters[SENT][me] > received[q] for q, seg in enumerate(self.segments) if q != me)

    # -- control plane ----------------------------------------------------------------------
    def group(self, group: Sequence[int]) -> tuple[list[int], int]:
        """Local indices of a group's members, and our position in it."""
        key = tuple(group)
        cached = self._groups.get(key)
        if cached is None:
            cached = self._groups[key] = ([self.index[r] for r in key], key.index(self.rank))
        return cached

    def send(self, q: int, payload: bytes) -> bool:
        """Post a message to local rank q; True when it went over TCP (flush before returning)."""
        sent = self.mine.counters[SENT]
        k = sent[q]
        if k >= 2:
            self._wait(q, RECEIVED, k - 1)  # its mailbox k % 2 is free again
        size = len(payload)
        via_tcp = size > CHANNEL_BYTES - 8
        if not via_tcp:
            self.mine.channel_data[q][k % 2][:size] = payload
        self.mine.channel_len[q][k % 2][0] = (_VIA_TCP | size) if via_tcp else size
        sent[q] = k + 1
        _fence()
        self._ring((SENT,), (q,))
        if via_tcp:
            self.tcp.peer(self.members[q]).send_frame(payload)
        return via_tcp

    def recv(self, q: int) -> bytes:
        received = self.mine.counters[RECEIVED]
        k = received[q]
        self._wait(q, SENT, k + 1)
        seg = self.segments[q]
        size = seg.channel_len[self.me][k % 2][0]
        if size & _VIA_TCP:
            payload = self.tcp.peer(self.members[q]).recv_frame()
        else:
            payload = bytes(seg.channel_data[self.me][k % 2][:size])
        received[q] = k + 1
        _fence()
        self._ring((RECEIVED,), (q,))
        return payload

    def _flush(self, ranks: Sequence[int]) -> None:
        for r in ranks:
            self.tcp.peer(r).flush()

    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        gl, pos = self.group(group)
        flush = [self.members[q] for i, q in enumerate(gl) if i != pos and self.send(q, payload)]
        result = [payload if i == pos else self.recv(q) for i, q in enumerate(gl)]
        self._flush(flush)
        return result

    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        gl, pos = self.group(group)
        if self.rank != root:
            if self.send(self.index[root], payload):
                self._flush([root])
            return None
        return [payload if i == pos else self.recv(q) for i, q in enumerate(gl)]

    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        gl, pos = self.group(group)
        if self.rank != root:
            return self.recv(self.index[root])
        assert payload is not None
        flush = [self.members[q] for i, q in enumerate(gl) if i != pos and self.send(q, payload)]
        self._flush(flush)
        return payload

    # -- data plane: helpers ----------------------------------------------------------------
    def _reuse(self, s: int) -> None:
        """Wait until every reader of our slot s's previous contents has finished with it."""
        for q, target in self.slot_readers[s]:
            self._wait(q, CONSUMED, target)

    def _finish(self, gl: Sequence[int], bases: Sequence[int], rounds: Sequence[int]) -> None:
        """Close the collective: every counter of every pair ends at base + rounds."""
        me, counters = self.me, self.mine.counters
        for q, base, count in zip(gl, bases, rounds):
            if q != me and count:
                end = base + count
                counters[STAGED][q] = counters[REDUCED][q] = counters[CONSUMED][q] = end
                self.rounds[q] = end

    def fusion_buffer(self, nbytes: int) -> np.ndarray | None:
        """`nbytes` of our fusion region (None if it is too small or /dev/shm is full)."""
        if nbytes > self._fusion_limit:
            return None
        if nbytes > self._fusion_reserved:
            grow = min(self._fusion_limit, max(_round_up(nbytes, 1 << 20), 2 * self._fusion_reserved))
            try:
                os.posix_fallocate(self._fd, self.layout.fusion + self._fusion_reserved, grow - self._fusion_reserved)
            except OSError as exc:
                log.warning("shared memory: could not grow the fusion buffer to %d bytes (%s); "
                            "fusing in private memory instead", grow, exc)
                self._fusion_limit = self._fusion_reserved  # stop trying
                return None
            self._fusion_reserved = grow
        return self.mine.fusion[:nbytes]

    def _descriptor(self, buf: np.ndarray) -> int:
        """1 + the byte offset of `buf` in our fusion region, or 0 when it lives elsewhere."""
        if not self._fusion_reserved:
            return 0
        offset = _address(buf) - self._fusion_addr
        if 0 <= offset and offset + buf.nbytes <= self._fusion_reserved and offset % buf.itemsize == 0:
            return offset + 1
        return 0

    # -- data plane: collectives ------------------------------------------------------------
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        gl, pos = self.group(group)
        if len(gl) == 2 and (buf.nbytes <= SMALL_ALLREDUCE_BYTES or not self._descriptor(buf)):
            self._allreduce_pair(gl, pos, buf, op)
        elif buf.nbytes <= SMALL_ALLREDUCE_BYTES or buf.size < len(gl):
            self._allreduce_whole(gl, pos, buf, op)
        else:
            self._sliced(gl, pos, buf, None, _even_counts(buf.size, len(gl)), op)

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                      op: int) -> None:
        gl, pos = self.group(group)
        if sum(counts) != buf.size:
            raise ValueError(f"segment counts sum to {sum(counts)}, buffer holds {buf.size}")
        self._sliced(gl, pos, buf, recv, counts, op)

    def _allreduce_whole(self, gl: list[int], pos: int, buf: np.ndarray, op: int) -> None:
        """Everyone stages its whole buffer; everyone reduces all of it in member order."""
        me, bases, typed = self.me, [self.rounds[q] for q in gl], self._typed(buf.dtype)
        self._reuse(0)
        own = typed[me][0][0][: buf.size]
        np.copyto(own, buf)
        self.slot_readers[0] = [(q, b + 1) for q, b in zip(gl, bases) if q != me]
        self._publish(STAGED, gl, bases, 1)
        for i, q in enumerate(gl):
            if i == pos:
                src = own
            else:
                self._wait(q, STAGED, bases[i] + 1)
                src = typed[q][0][0][: buf.size]
            if i == 0:
                if pos != 0:
                    np.copyto(buf, src)
            else:
                reduce_into(buf, src, op)
        self._publish(CONSUMED, gl, bases, 1)
        self._finish(gl, bases, [1] * len(gl))

    def _allreduce_pair(self, gl: list[int], pos: int, buf: np.ndarray, op: int) -> None:
        """Two members: each stages its buffer round by round and reduces the other's copy into its
        own. The operations are commutative (a + b and b + a are the same bits), so both end alike;
        it is as much work as slicing for two, with fewer steps."""
        q = gl[1 - pos]
        base, bases = self.rounds[q], [self.rounds[r] for r in gl]
        pe = self.layout.slot_bytes // buf.itemsize
        total_rounds = math.ceil(buf.size / pe)
        typed = self._typed(buf.dtype)
        mine, theirs = typed[self.me][0], typed[q][0]

        def stage(r: int) -> None:
            self._reuse(r % DEPTH)
            chunk = buf[r * pe: (r + 1) * pe]
            np.copyto(mine[r % DEPTH][: chunk.size], chunk)
            self.slot_readers[r % DEPTH] = [(q, base + r + 1)]

        stage(0)
        self._progress(gl, bases, 1, 0, 0)
        for r in range(total_rounds):
            if r + 1 < total_rounds:
                stage(r + 1)
            self._wait(q, STAGED, base + r + 1)
            chunk = buf[r * pe: (r + 1) * pe]
            reduce_into(chunk, theirs[r % DEPTH][: chunk.size], op)
            self._progress(gl, bases, min(r + 2, total_rounds), 0, r + 1)
        self._finish(gl, bases, [total_rounds] * 2)

    def _sliced(self, gl: list[int], pos: int, buf: np.ndarray, out: np.ndarray | None, counts: Sequence[int],
                op: int) -> None:
        """Reduce `buf` slice by slice: member i reduces slice i (counts[i] elements).

        With `out` None (allreduce) every member then copies the others' reduced slices into `buf`;
        otherwise (reducescatter) our reduced slice goes to `out` and that is all. Round r stages
        piece r of every slice; our progress (staged, reduced, consumed) goes out once per round.
        """
        n, dtype = len(gl), buf.dtype
        pe = min(PIECE_BYTES, self.layout.slot_bytes // n) // 64 * 64 // dtype.itemsize  # elements a piece
        offs = _offsets(counts)
        total_rounds = max(math.ceil(c / pe) for c in counts)
        if total_rounds == 0:
            return
        bases = [self.rounds[q] for q in gl]
        peers = [(i, q) for i, q in enumerate(gl) if i != pos]
        gather = out is None
        desc = self._descriptor(buf)
        typed = self._typed(dtype)
        own_slots = typed[self.me][0]
        peer_desc = [0] * n
        lows = [offs[i] for i in range(n)]
        ends = [offs[i] + counts[i] for i in range(n)]

        def piece(i: int, r: int) -> tuple[int, int]:
            lo = lows[i] + r * pe
            return min(lo, ends[i]), min(lo + pe, ends[i])

        def source(i: int, q: int, owner: int, r: int, lo: int, hi: int) -> np.ndarray:
            """Rank q's piece r of slice `owner` (staged at position `owner`, or in its fusion buffer)."""
            if peer_desc[i]:
                at = (peer_desc[i] - 1) // dtype.itemsize + lo
                return typed[q][1][at: at + hi - lo]
            at = owner * pe
            return typed[q][0][r % DEPTH][at: at + hi - lo]

        def stage(r: int) -> None:
            self._reuse(r % DEPTH)
            if r == 0:
                self.mine.slot_desc[0] = desc
            if not desc:
                slot = own_slots[r % DEPTH]
                for i in range(n):
                    lo, hi = piece(i, r)
                    if i != pos and hi > lo:
                        np.copyto(slot[i * pe: i * pe + hi - lo], buf[lo:hi])
            self.slot_readers[r % DEPTH] = [(q, bases[i] + r + 1) for i, q in peers]

        def gather_round(r: int) -> None:
            for i, q in peers:
                lo, hi = piece(i, r)
                self._wait(q, REDUCED, bases[i] + r + 1)
                if hi > lo:
                    np.copyto(buf[lo:hi], source(i, q, i, r, lo, hi))

        stage(0)
        staged = total_rounds if desc else 1  # with a descriptor, the whole buffer is readable at once
        consumed = 0
        self._progress(gl, bases, staged, 0, 0)
        for r in range(total_rounds):
            if not desc and r + 1 < total_rounds:
                stage(r + 1)
                staged = r + 2
            lo, hi = piece(pos, r)
            target = buf[lo:hi] if gather else out[lo - offs[pos]: hi - offs[pos]]
            if not gather and hi > lo:
                np.copyto(target, buf[lo:hi])
            for i, q in peers:
                self._wait(q, STAGED, bases[i] + r + 1)
                if r == 0:
                    peer_desc[i] = self.segments[q].slot_desc[0]
                if hi > lo:
                    reduce_into(target, source(i, q, pos, r, lo, hi), op)
            if gather and not desc and hi > lo:
                np.copyto(own_slots[r % DEPTH][pos * pe: pos * pe + hi - lo], target)
            # Consumption is reported a round late; DEPTH >= 3 keeps that from stalling stage().
            self._progress(gl, bases, staged, r + 1 if gather else 0, consumed)
            if not gather:
                consumed = r + 1
            elif r:
                gather_round(r - 1)
                consumed = r
        if gather:
            gather_round(total_rounds - 1)
        self._progress(gl, bases, staged, total_rounds if gather else 0, total_rounds)
        if desc:  # peers read our buffer in place: the caller may change it only once they are done
            for i, q in peers:
                self._wait(q, CONSUMED, bases[i] + total_rounds)
        self._finish(gl, bases, [total_rounds] * n)

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> None:
        gl, pos = self.group(group)
        pe = self.layout.slot_bytes // recv.itemsize
        offs = _offsets(counts)
        if offs[-1] + counts[-1] != recv.size:
            raise ValueError(f"segment counts sum to {sum(counts)}, buffer holds {recv.size}")
        mine = recv[offs[pos]: offs[pos] + counts[pos]]
        if _address(mine) != _address(send):
            np.copyto(mine, send[: counts[pos]])
        total_rounds = max(math.ceil(c / pe) for c in counts)
        bases = [self.rounds[q] for q in gl]
        peers = [(i, q) for i, q in enumerate(gl) if i != pos]
        typed = self._typed(recv.dtype)

        def stage(r: int) -> None:
            self._reuse(r % DEPTH)
            chunk = send[r * pe: min((r + 1) * pe, counts[pos])]
            np.copyto(typed[self.me][0][r % DEPTH][: chunk.size], chunk)
            self.slot_readers[r % DEPTH] = [(q, bases[i] + r + 1) for i, q in peers]
            self._publish(STAGED, gl, bases, r + 1)

        if total_rounds:
            stage(0)
        for r in range(total_rounds):
            if r + 1 < total_rounds:
                stage(r + 1)
            for i, q in peers:
                lo, hi = min(r * pe, counts[i]), min((r + 1) * pe, counts[i])
                self._wait(q, STAGED, bases[i] + r + 1)
                np.copyto(recv[offs[i] + lo: offs[i] + hi], typed[q][0][r % DEPTH][: hi - lo])
            self._publish(CONSUMED, gl, bases, r + 1)
        self._finish(gl, bases, [total_rounds] * len(gl))

    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        gl, pos = self.group(group)
        pe = self.layout.slot_bytes // buf.itemsize
        total_rounds = math.ceil(buf.size / pe)
        typed = self._typed(buf.dtype)
        bases = [self.rounds[q] for q in gl]
        r_idx = self.index[root]
        r_pos = gl.index(r_idx)
        if self.rank == root:
            readers = [(q, b) for q, b in zip(gl, bases) if q != self.me]
            for r in range(total_rounds):
                chunk = buf[r * pe: (r + 1) * pe]
                self._reuse(r % DEPTH)
                np.copyto(typed[self.me][0][r % DEPTH][: chunk.size], chunk)
                self.slot_readers[r % DEPTH] = [(q, b + r + 1) for q, b in readers]
                self._publish(STAGED, gl, bases, r + 1)
        else:
            for r in range(total_rounds):
                chunk = buf[r * pe: (r + 1) * pe]
                self._wait(r_idx, STAGED, bases[r_pos] + r + 1)
                np.copyto(chunk, typed[r_idx][0][r % DEPTH][: chunk.size])
                self._publish(CONSUMED, (r_idx,), (bases[r_pos],), r + 1)
        self._finish(gl, bases, [total_rounds] * len(gl))

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int]) -> None:
        gl, pos = self.group(group)
        n = len(gl)
        s_offs, r_offs = _offsets(send_counts), _offsets(recv_counts)
        np.copyto(recv[r_offs[pos]: r_offs[pos] + recv_counts[pos]], send[s_offs[pos]: s_offs[pos] + send_counts[pos]])
        if n == 1:
            return
        # A round's slot holds one piece for each other member, in member order without us.
        pe = self.layout.slot_bytes // (n - 1) // 64 * 64 // recv.itemsize
        # Each pair agrees on its own number of rounds: enough for the larger of its two blocks.
        pair_rounds = [0 if i == pos else math.ceil(max(send_counts[i], recv_counts[i]) / pe) for i in range(n)]
        bases = [self.rounds[q] for q in gl]
        peers = [(i, q) for i, q in enumerate(gl) if i != pos]
        typed = self._typed(recv.dtype)

        def active(r: int) -> list[tuple[int, int]]:
            return [(i, q) for i, q in peers if r < pair_rounds[i]]

        def stage(r: int) -> None:
            self._reuse(r % DEPTH)
            slot = typed[self.me][0][r % DEPTH]
            now = active(r)
            for i, _ in now:
                lo, hi = min(r * pe, send_counts[i]), min((r + 1) * pe, send_counts[i])
                at = (i if i < pos else i - 1) * pe
                np.copyto(slot[at: at + hi - lo], send[s_offs[i] + lo: s_offs[i] + hi])
            self.slot_readers[r % DEPTH] = [(q, bases[i] + r + 1) for i, q in now]
            self._publish(STAGED, [q for _, q in now], [bases[i] for i, _ in now], r + 1)

        total_rounds = max(pair_rounds)
        if total_rounds:
            stage(0)
        for r in range(total_rounds):
            if r + 1 < total_rounds:
                stage(r + 1)
            now = active(r)
            for i, q in now:
                lo, hi = min(r * pe, recv_counts[i]), min((r + 1) * pe, recv_counts[i])
                self._wait(q, STAGED, bases[i] + r + 1)
                at = (pos if pos < i else pos - 1) * pe
                np.copyto(recv[r_offs[i] + lo: r_offs[i] + hi], typed[q][0][r % DEPTH][at: at + hi - lo])
            self._publish(CONSUMED, [q for _, q in now], [bases[i] for i, _ in now], r + 1)
        self._finish(gl, bases, pair_rounds)


class ShmTransport(Transport):
    """Shared memory among the ranks of this host, TCP for everything that crosses hosts.

    The TCP mesh is always built: it carries collectives whose members span hosts, control
    messages too large for a mailbox, and it is how a crashed peer is noticed.
    """

    name = "shm"

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        rank, size, settings = self.rank, self.size, context.settings
        peer_timeout = settings.peer_timeout_seconds
        self.tcp = TcpTransport(context)
        self.shm: SharedMemory | None = None
        hostname = context.topology.hostname or socket.gethostname()
        self.hosts: list[str] = [hostname]
        if size > 1:
            try:
                self.hosts = [p.decode() for p in self.tcp.exchange(list(range(size)), hostname.encode())]
            except BaseException:  # a peer died during set-up: leave no connection behind
                self.tcp.close()
                raise
        self.local_ranks = [r for r in range(size) if self.hosts[r] == hostname]
        self._local = set(self.local_ranks)
        fusion = settings.fusion_threshold
        if len(self.local_ranks) > 1:
            try:
                self.shm = SharedMemory(self.tcp, self.local_ranks, rank, min(fusion, 1 << 30), peer_timeout)
            except Unavailable as exc:
                log.warning("rank %d: shared memory is unavailable (%s); ranks on this host talk over TCP",
                            rank, exc)
            except BaseException:
                self.tcp.close()
                raise
        self._routes: dict[tuple[int, ...], bool] = {}

    def _on_host(self, group: Sequence[int]) -> SharedMemory | None:
        """The shared-memory domain when every member of `group` is on this host (and it has 2+)."""
        key = tuple(group)
        local = self._routes.get(key)
        if local is None:
            local = self._routes[key] = self.shm is not None and len(key) > 1 and self._local.issuperset(key)
        return self.shm if local else None

    # -- data plane -------------------------------------------------------------------------
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        if len(group) == 1 or buf.size == 0:
            return
        (self._on_host(group) or self.tcp).allreduce(group, buf, op)

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> None:
        (self._on_host(group) or self.tcp).allgatherv(group, send, recv, counts)

    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        if len(group) == 1 or buf.size == 0:
            return
        (self._on_host(group) or self.tcp).broadcast(group, buf, root)

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int]) -> None:
        (self._on_host(group) or self.tcp).alltoallv(group, send, send_counts, recv, recv_counts)

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                      op: int) -> None:
        (self._on_host(group) or self.tcp).reducescatter(group, buf, recv, counts, op)

    def fusion_buffer(self, nbytes: int) -> np.ndarray | None:
        return self.shm.fusion_buffer(nbytes) if self.shm is not None else None

    # -- control plane ----------------------------------------------------------------------
    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        return (self._on_host(group) or self.tcp).exchange(group, payload)

    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        return (self._on_host(group) or self.tcp).gather(group, payload, root)

    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        return (self._on_host(group) or self.tcp).bcast_bytes(group, payload, root)

    # -- telling the engine that a peer is talking ----------------------------------------
    @property
    def spin_useful(self) -> bool:  # type: ignore[override]
        return self.shm is not None and self.shm._may_spin

    def has_activity(self) -> bool:
        return self.shm is not None and self.shm.pending()

    def activity_fds(self, driver: bool) -> dict[int, bool]:
        fds = self.tcp.activity_fds(driver)
        if self.shm is not None:
            fds[(self.shm.bell if driver else self.shm.idle_bell).fileno()] = False
        return fds

    def listen(self, driver: bool, on: bool) -> None:
        if self.shm is not None:
            self.shm.set_listening(on, driver)

    def drain(self, driver: bool) -> None:
        if self.shm is not None:
            self.shm.drain(idle=not driver)

    def set_caller_driving(self, on: bool) -> bool:
        return self.shm.set_driven(on) if self.shm is not None else False

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
        self.tcp.close()


def shared_memory_usable() -> bool:
    """Whether this platform offers what the shm transport needs (Linux: /dev/shm, abstract sockets)."""
    return sys.platform.startswith("linux") and os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)
