"""The built-in transport: a full mesh of authenticated TCP connections.

Large allreduces run as a bandwidth-optimal ring (reduce-scatter, then allgather). Within a ring
step, a per-peer sender thread pushes our segment while this thread receives the neighbour's
segment chunk by chunk and reduces each chunk as it lands, so sending, receiving and reducing
overlap. Small messages skip the ring: every member sends its whole buffer to every other and
reduces locally in member order, which costs one network latency instead of 2(n-1).
"""

from __future__ import annotations

import errno
import os
import queue
import select
import selectors
import socket
import threading
import time
from typing import Callable, Sequence

import numpy as np

from horovod.common import wire
from horovod.common.reduce_ops import reduce_into
from horovod.common.rendezvous import RendezvousClient
from horovod.common.settings import DEFAULT_FAILURE_DETECTION_SECONDS
from horovod.common.transport.base import PeerFailure, Transport, TransportContext

# Below this many bytes a message is sent from the calling thread (it fits in the socket buffers).
INLINE_SEND_BYTES = 64 * 1024
# Below this many bytes an allreduce is a direct exchange instead of a ring.
DIRECT_ALLREDUCE_BYTES = 256 * 1024
# Receive-and-reduce granularity of the ring: big enough to amortise calls, small enough to overlap.
RING_CHUNK_BYTES = 1024 * 1024
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
# poll() events of a connection whose other end closed or broke (POLLRDHUP: Linux only).
HANGUP = getattr(select, "POLLRDHUP", 0) | getattr(select, "POLLHUP", 0) | getattr(select, "POLLERR", 0)
CLOSED_BY_PEER = "closed its connection (its process exited or crashed)"
# How long to wait for a rank's connection to close when another rank says it failed (see _hung_up).
HANGUP_GRACE_SECONDS = 0.1
# While waiting for peers at start-up, how often to ask the launcher whether a rank has gone.
SETUP_POLL_SECONDS = 0.25
# The launcher enforces the start timeout and names the rank that did not join; a rank's own
# deadline is this much later, a backstop for when the launcher cannot tell.
START_BACKSTOP_SECONDS = 2.0


class DeathWatch:
    """Names the rank that failed first, when one failure brings others down with it.

    A thread of its own notices, as they happen, peers whose connection closes (and calls
    `listeners`, so waits elsewhere can stop at once). A rank that reported a failure says whom it
    blamed before it closes its connections (`announce`: in the rendezvous store, and through
    `local_cause` where a faster channel exists, shared memory); so when a connection closes, we
    can tell a rank that crashed from one that stopped because of another.
    """

    def __init__(self, rank: int, sockets: dict[int, socket.socket], store: RendezvousClient, scope: str,
                 hosts: dict[int, str] | None = None,
                 detection_seconds: float = DEFAULT_FAILURE_DETECTION_SECONDS) -> None:
        self.first: int | None = None  # the rank that failed first, once known
        self.hosts = hosts or {}  # where each rank runs, for messages
        self._sockets = dict(sockets)
        self._detection_seconds = detection_seconds
        self._reasons: dict[int, str] = {}  # ranks whose host stopped answering (the kernel said so)
        self._reasons_lock = threading.Lock()
        self._told: dict[int, str] = {}  # how a rank failed, as the rank that blamed it put it
        self._tellers: dict[int, int] = {}  # who blamed a rank (the first to tell us)
        self._reported_reason = ""
        self.listeners: list = []  # called (on the watch thread) when a connection closes
        self.local_cause: Callable[[int], int | None] | None = None  # whom a rank blamed, if known locally
        self.reported: int | None = None  # the rank our own failure report named
        self._rank = rank
        self._store, self._scope = store, scope
        self._ranks = {sock.fileno(): r for r, sock in sockets.items()}
        self._stop_r, self._stop_w = os.pipe()
        self._poll = select.poll()
        self._poll.register(self._stop_r, select.POLLIN)
        for sock in sockets.values():
            self._poll.register(sock, HANGUP)
        self._thread = threading.Thread(target=self._run, name="hvd-death-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            for fd, _ in self._poll.poll():
                if fd == self._stop_r:
                    return
                self._poll.unregister(fd)
                self._kernel_reason(self._ranks[fd])
                if self.first is None:
                    self.first = self._cause(self._ranks[fd])
                for listener in list(self.listeners):
                    listener()

    def note_unreachable(self, rank: int, reason: str) -> None:
        """A read or write to `rank` failed because its host stopped answering (that error is
        reported once: remember it for later messages)."""
        with self._reasons_lock:
            self._reasons.setdefault(rank, reason)

    def _kernel_reason(self, rank: int) -> str | None:
        """Why the connection to `rank` broke when it was not closed but timed out or lost its route
        (a cut network, a host down): the socket's pending error says so, once; kept here."""
        with self._reasons_lock:
            if rank not in self._reasons and rank in self._sockets:
                try:
                    code = self._sockets[rank].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                except OSError:
                    code = 0
                if code in _UNREACHABLE:
                    self._reasons[rank] = unreachable(self._detection_seconds, OSError(code, os.strerror(code)))
            return self._reasons.get(rank)

    def _cause(self, rank: int) -> int:
        """Whom `rank` blamed when it stopped, or `rank` itself if it left no word (it crashed)."""
        local_cause = self.local_cause
        known = local_cause(rank) if local_cause is not None else None
        if known is None:
            try:
                blamed, _, why = self._store.get(self._scope, f"blame.{rank}", 0.0).decode().partition("\n")
                known = int(blamed)
                if why:
                    self._told.setdefault(known, why)
            except (TimeoutError, OSError, ValueError):
                return rank
        if known != rank:
            self._tellers.setdefault(known, rank)
        return known

    def _hung_up(self, rank: int) -> bool:
        """Whether `rank`'s end of its connection closes within a moment, as a crashed process's
        does (a dying process closes its sockets one after another: another rank may have seen
        one of them close, and stopped, before ours does)."""
        try:
            probe = select.poll()
            probe.register(self._sockets[rank], HANGUP)
            return bool(probe.poll(int(HANGUP_GRACE_SECONDS * 1000)))
        except (KeyError, ValueError, OSError):
            return False

    def blame(self, rank: int, reason: str) -> PeerFailure:
        """The failure to report when talking to `rank` failed for `reason`: the rank that failed
        first, and how, as far as this rank can tell (it may only know that another blamed it)."""
        first = self.first if self.first is not None else self._cause(rank)
        seen = self._kernel_reason(rank)  # what this rank's own connection to `rank` says
        if first == rank:
            how = seen or reason
        elif seen and not self._kernel_reason(first):
            first, how = rank, seen  # a network fault we saw ourselves beats what another rank said
        else:
            teller = self._tellers.get(first, rank)
            how = (self._kernel_reason(first) or self._told.get(first)
                   or (CLOSED_BY_PEER if self._hung_up(first) else
                       f"failed, according to rank {teller}, which stopped because of it"))
        if self.reported is None:
            self.reported, self._reported_reason = first, how
        return PeerFailure(first, how, self.hosts.get(first))

    def announce(self) -> None:
        """Before our connections close: tell the others whom we blamed and why, if we failed."""
        if self.reported is not None:
            try:
                self._store.put(self._scope, f"blame.{self._rank}",
                                f"{self.reported}\n{self._reported_reason}".encode())
            except OSError:
                pass

    def close(self) -> None:
        os.write(self._stop_w, b"\0")
        self._thread.join(timeout=1.0)
        os.close(self._stop_r)
        os.close(self._stop_w)


class _Peer:
    """One authenticated connection, with a sender thread for large asynchronous sends."""

    def __init__(self, rank: int, sock: socket.socket, timeout: float, host: str | None = None,
                 detection_seconds: float = DEFAULT_FAILURE_DETECTION_SECONDS) -> None:
        self.rank = rank
        self.sock = sock
        self.timeout = timeout
        self.host = host
        self.detection_seconds = detection_seconds
        self._outbox: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._error: BaseException | None = None
        self.deaths: DeathWatch | None = None
        self._thread = threading.Thread(target=self._send_loop, name=f"hvd-send-{rank}", daemon=True)
        self._thread.start()

    def _send_loop(self) -> None:
        while True:
            view = self._outbox.get()
            if view is None:
                return
            try:
                if self._error is None:
                    self.sock.sendall(view)
            except OSError as exc:
                self._error = exc
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()

    def send(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        view = _byte_view(data)
        if view.nbytes <= INLINE_SEND_BYTES and self._pending == 0:
            try:
                self.sock.sendall(view)
            except OSError as exc:
                raise self.failure(exc) from None
            return
        with self._idle:
            self._pending += 1
        self._outbox.put(view)

    def flush(self) -> None:
        """Wait until every queued send has left; raise PeerFailure if one could not."""
        deadline = time.monotonic() + self.timeout
        with self._idle:
            while self._pending:
                if not self._idle.wait(max(0.0, deadline - time.monotonic())):
                    raise self._blame(f"accepted no data for {self.timeout:.0f} s (hung?)")
        if self._error is not None:
            raise self.failure(self._error)

    def recv_into(self, view: memoryview | np.ndarray) -> None:
        try:
            wire.recv_into_exact(self.sock, _byte_view(view))
        except (OSError, wire.WireError) as exc:
            if isinstance(exc, socket.timeout) and exc.errno is None:  # our own timeout, not the kernel's
                raise self._blame(f"sent nothing for {self.timeout:.0f} s (hung?)") from None
            raise self.failure(exc) from None

    def send_frame(self, payload: bytes) -> None:
        self.send(wire._LEN.pack(len(payload)) + payload if len(payload) <= INLINE_SEND_BYTES else
                  wire._LEN.pack(len(payload)))
        if len(payload) > INLINE_SEND_BYTES:
            self.send(payload)

    def recv_frame(self) -> bytes:
        header = bytearray(wire._LEN.size)
        self.recv_into(header)
        (length,) = wire._LEN.unpack(header)
        if length > wire.MAX_FRAME_BYTES:
            raise PeerFailure(self.rank, f"sent a {length}-byte control frame (protocol violation)")
        body = bytearray(length)
        self.recv_into(body)
        return bytes(body)

    def failure(self, exc: BaseException) -> PeerFailure:
        if isinstance(exc, PeerFailure):
            return exc
        if isinstance(exc, (ConnectionResetError, BrokenPipeError, wire.WireError)):
            return self._blame(CLOSED_BY_PEER)
        if getattr(exc, "errno", None) in _UNREACHABLE:
            reason = unreachable(self.detection_seconds, exc)
            if self.deaths is not None:
                self.deaths.note_unreachable(self.rank, reason)
            return self._blame(reason)
        return self._blame(f"connection failed: {exc}")

    def _blame(self, reason: str) -> PeerFailure:
        if self.deaths is not None:
            return self.deaths.blame(self.rank, reason)
        return PeerFailure(self.rank, reason, self.host)

    def close(self) -> None:
        self._outbox.put(None)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=1.0)


# What the kernel reports when a peer's host stopped answering (liveness checks gave up, or the
# network says there is no route any more).
_UNREACHABLE = {errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}


def unreachable(detection_seconds: float, exc: BaseException) -> str:
    """The reason given for a peer whose host stopped answering."""
    return (f"stopped answering: its host sent nothing back for about {detection_seconds:g} s "
            f"({getattr(exc, 'strerror', None) or exc}; network cut, or the host is down?)")


def _byte_view(data: bytes | bytearray | memoryview | np.ndarray) -> memoryview:
    """Raw bytes of a buffer; numpy arrays of any dtype (float16, bfloat16 have no buffer format)."""
    if isinstance(data, np.ndarray):
        return memoryview(data.reshape(-1).view(np.uint8))
    return memoryview(data).cast("B")


def _advertised_host(rendezvous_addr: str) -> str:
    """The address peers should use to reach us: loopback for a one-host job, else our route out."""
    if rendezvous_addr in ("localhost", "") or rendezvous_addr.startswith("127."):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((rendezvous_addr, 9))
        return probe.getsockname()[0]
    finally:
        probe.close()


def _tune(sock: socket.socket, detection_seconds: float) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    wire.enable_liveness_checks(sock, detection_seconds)


class TcpTransport(Transport):
    name = "tcp"

    def __init__(self, context: TransportContext) -> None:
        rank, size, rendezvous, settings = context.rank, context.size, context.rendezvous, context.settings
        secret_key, generation, topology = settings.secret_key, context.round, context.topology
        rendezvous_addr, start_timeout = context.store_host, settings.start_timeout
        peer_timeout = settings.peer_timeout_seconds
        super().__init__(rank, size)
        self._peers: dict[int, _Peer] = {}
        self._scratch = np.empty(0, np.uint8)
        self._selectors: dict[bool, selectors.BaseSelector] = {}  # the driver's and the idle engine thread's
        self._selector_lock = threading.Lock()
        self.deaths: DeathWatch | None = None
        self.hostname = getattr(topology, "hostname", None) or socket.gethostname()
        self.hosts: dict[int, str] = {rank: self.hostname}  # where each rank runs, for messages
        self.detection_seconds = float(getattr(settings, "failure_detection_seconds",
                                               DEFAULT_FAILURE_DETECTION_SECONDS))
        if size > 1:
            assert rendezvous is not None and secret_key is not None
            try:
                self._connect_mesh(rendezvous, secret_key, generation, rendezvous_addr, start_timeout, peer_timeout)
            except BaseException:
                self.close()
                raise

    # -- setup ------------------------------------------------------------------------------
    def _connect_mesh(self, rendezvous: RendezvousClient, key: bytes, generation: int, rendezvous_addr: str,
                      start_timeout: float, peer_timeout: float) -> None:
        """Connect to every lower rank, accept every higher one. A rank the launcher reports gone
        fails this at once, naming it; otherwise the start timeout bounds every wait."""
        host = _advertised_host(rendezvous_addr)
        # Only the interface peers are told about: loopback for a one-host job.
        listener = socket.create_server((host, 0), backlog=self.size)
        scope = f"transport.{generation}"
        rendezvous.put(scope, str(self.rank), wire.encode((host, listener.getsockname()[1], self.hostname)))
        deadline = time.monotonic() + start_timeout + START_BACKSTOP_SECONDS
        try:
            for peer in range(self.rank):
                sock = self._dial(rendezvous, scope, peer, deadline, start_timeout)
                wire.handshake(sock, key, initiator=True)
                wire.send_message(sock, ("hello", self.rank, generation, self.hostname))
                self._add_peer(peer, sock, peer_timeout)
            listener.settimeout(SETUP_POLL_SECONDS)
            while len(self._peers) < self.size - 1:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.rank + 1, self.size)) - set(self._peers))
                    raise TimeoutError(
                        f"ranks {missing} did not connect to rank {self.rank} within the start timeout "
                        f"({start_timeout:g} s); did they all start? (raise --start-timeout if start-up is slow)")
                try:
                    sock, addr = listener.accept()
                except socket.timeout:
                    _raise_if_lost(rendezvous)
                    continue
                hello = self._greet(sock, key, generation, deadline)
                if isinstance(hello, str):
                    from horovod.common.logging import log

                    log.warning("rank %d: refused a data connection from %s: %s", self.rank, addr, hello)
                    sock.close()
                    continue
                self.hosts[hello[1]] = hello[3]
                self._add_peer(hello[1], sock, peer_timeout)
        except (OSError, wire.WireError):
            _raise_if_lost(rendezvous)  # a peer gave up because of a rank that is gone: name that one
            raise
        finally:
            listener.close()
        for peer in self._peers.values():
            peer.sock.settimeout(peer_timeout)
        if HANGUP & getattr(select, "POLLRDHUP", 0):
            self.deaths = DeathWatch(self.rank, {r: peer.sock for r, peer in self._peers.items()}, rendezvous,
                                     f"transport.{generation}", self.hosts, self.detection_seconds)
            for peer in self._peers.values():
                peer.deaths = self.deaths

    def _dial(self, rendezvous: RendezvousClient, scope: str, peer: int, deadline: float,
              start_timeout: float) -> socket.socket:
        """A connection to the lower rank `peer`, once it has published its address."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"rank {peer} did not join within the start timeout ({start_timeout:g} s); did it start? "
                    "Its output may say why (raise --start-timeout if start-up is slow).")
            try:
                address = rendezvous.get(scope, str(peer), min(SETUP_POLL_SECONDS, remaining))
                break
            except TimeoutError:
                _raise_if_lost(rendezvous)
        peer_host, port, self.hosts[peer] = wire.decode(address)
        where = f"{peer_host}:{port}"
        # Its listener exists before its address is published: a host that is up answers at once.
        connect_timeout = max(1.0, self.detection_seconds)
        try:
            sock = socket.create_connection((peer_host, int(port)), timeout=connect_timeout)
        except socket.timeout:
            raise PeerFailure(peer, f"could not be reached at {where} within {connect_timeout:g} s "
                              "(network down, or a firewall in the way?)", self.hosts[peer]) from None
        except OSError as exc:
            raise PeerFailure(peer, f"refused a connection to {where} ({exc.strerror or exc}; did it exit?)",
                              self.hosts[peer]) from None
        sock.settimeout(max(1.0, deadline - time.monotonic()))  # it accepts once its own dialling is done
        _tune(sock, self.detection_seconds)
        return sock

    def _greet(self, sock: socket.socket, key: bytes, generation: int, deadline: float) -> tuple | str:
        """Authenticate an incoming connection: its greeting, or why it was refused. A real peer
        speaks at once, so a silent stranger cannot hold up start-up for long."""
        wait = max(0.1, min(max(1.0, self.detection_seconds), deadline - time.monotonic()))
        try:
            sock.settimeout(wait)
            _tune(sock, self.detection_seconds)
            wire.handshake(sock, key, initiator=False)
            hello = wire.recv_message(sock, max_bytes=1024)
        except socket.timeout:
            return f"it sent nothing for {wait:g} s"
        except (wire.WireError, OSError) as exc:
            return str(exc)
        if not (isinstance(hello, tuple) and len(hello) == 4 and hello[0] == "hello" and hello[2] == generation
                and isinstance(hello[1], int) and self.rank < hello[1] < self.size
                and hello[1] not in self._peers and isinstance(hello[3], str)):
            return f"unexpected greeting {hello!r:.80}"
        return hello

    def _add_peer(self, rank: int, sock: socket.socket, peer_timeout: float) -> None:
        self._peers[rank] = _Peer(rank, sock, peer_timeout, self.hosts.get(rank), self.detection_seconds)

    # -- primitives -------------------------------------------------------------------------
    def peer(self, rank: int) -> _Peer:
        """The connection to `rank` (transports layered on this mesh use it for failure detection
        and for control frames too large for their own channels)."""
        return self._peers[rank]

    def _scratch_bytes(self, nbytes: int) -> np.ndarray:
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes]

    def _flush(self, ranks: Sequence[int]) -> None:
        for r in ranks:
            if r != self.rank:
                self._peers[r].flush()

    # -- data plane -------------------------------------------------------------------------
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        if len(group) == 1 or buf.size == 0:
            return
        if buf.nbytes <= DIRECT_ALLREDUCE_BYTES or buf.size < len(group):
            self._direct_allreduce(group, buf, op)
            return
        bounds = _segment_bounds(buf.size, [buf.size // len(group) + (i < buf.size % len(group))
                                            for i in range(len(group))])
        self._ring_reduce_scatter(group, buf, bounds, op)
        self._ring_allgather(group, buf, bounds)

    def _direct_allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        others = [r for r in group if r != self.rank]
        for r in others:
            self._peers[r].send(buf)
        scratch = self._scratch_bytes(buf.nbytes * len(others)).view(buf.dtype)
        received = {}
        for i, r in enumerate(others):
            part = scratch[i * buf.size:(i + 1) * buf.size]
            self._peers[r].recv_into(part)
            received[r] = part
        self._flush(others)
        # Reduce in member order so every rank computes bit-identical floating-point results.
        own = buf.copy() if group[0] != self.rank else buf
        first = buf if group[0] == self.rank else received[group[0]]
        if first is not buf:
            np.copyto(buf, first)
        for r in group[1:]:
            reduce_into(buf, own if r == self.rank else received[r], op)

    def _ring_reduce_scatter(self, group: Sequence[int], buf: np.ndarray, bounds: list[tuple[int, int]],
                             op: int) -> None:
        """Leaves member i holding the fully reduced segment i of `buf`."""
        n = len(group)
        pos = group.index(self.rank)
        right, left = self._peers[group[(pos + 1) % n]], self._peers[group[(pos - 1) % n]]
        chunk = max(1, RING_CHUNK_BYTES // buf.itemsize)
        scratch = self._scratch_bytes(min(chunk, buf.size) * buf.itemsize).view(buf.dtype)
        for step in range(n - 1):
            s_lo, s_hi = bounds[(pos - step - 1) % n]
            r_lo, r_hi = bounds[(pos - step - 2) % n]
            right.send(buf[s_lo:s_hi])
            for lo in range(r_lo, r_hi, chunk):
                hi = min(lo + chunk, r_hi)
                part = scratch[: hi - lo]
                left.recv_into(part)
                reduce_into(buf[lo:hi], part, op)
            right.flush()

    def _ring_allgather(self, group: Sequence[int], buf: np.ndarray, bounds: list[tuple[int, int]]) -> None:
        n = len(group)
        pos = group.index(self.rank)
        right, left = self._peers[group[(pos + 1) % n]], self._peers[group[(pos - 1) % n]]
        for step in range(n - 1):
            s_lo, s_hi = bounds[(pos - step) % n]
            r_lo, r_hi = bounds[(pos - step - 1) % n]
            right.send(buf[s_lo:s_hi])
            left.recv_into(buf[r_lo:r_hi])
            right.flush()

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray,
                      counts: Sequence[int], op: int) -> None:
        bounds = _segment_bounds(buf.size, counts)
        pos = group.index(self.rank)
        if len(group) > 1:
            self._ring_reduce_scatter(group, buf, bounds, op)
        lo, hi = bounds[pos]
        np.copyto(recv[: hi - lo], buf[lo:hi])

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray,
                   counts: Sequence[int]) -> None:
        bounds = _segment_bounds(recv.size, counts)
        pos = group.index(self.rank)
        others = [r for r in group if r != self.rank]
        for r in others:
            self._peers[r].send(send)
        lo, hi = bounds[pos]
        np.copyto(recv[lo:hi], send[: hi - lo])
        for i, r in enumerate(group):
            if r != self.rank:
                lo, hi = bounds[i]
                self._peers[r].recv_into(recv[lo:hi])
        self._flush(others)

    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        if len(group) == 1 or buf.size == 0:
            return
        if self.rank == root:
            others = [r for r in group if r != root]
            for r in others:
                self._peers[r].send(buf)
            self._flush(others)
        else:
            self._peers[root].recv_into(buf)

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int],
                  recv: np.ndarray, recv_counts: Sequence[int]) -> None:
        s_bounds = _segment_bounds(send.size, send_counts)
        r_bounds = _segment_bounds(recv.size, recv_counts)
        pos = group.index(self.rank)
        others = [r for r in group if r != self.rank]
        for i, r in enumerate(group):
            if r != self.rank:
                lo, hi = s_bounds[i]
                self._peers[r].send(send[lo:hi])
        (s_lo, s_hi), (r_lo, r_hi) = s_bounds[pos], r_bounds[pos]
        np.copyto(recv[r_lo:r_hi], send[s_lo:s_hi])
        for i, r in enumerate(group):
            if r != self.rank:
                lo, hi = r_bounds[i]
                self._peers[r].recv_into(recv[lo:hi])
        self._flush(others)

    # -- control plane ----------------------------------------------------------------------
    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        others = [r for r in group if r != self.rank]
        for r in others:
            self._peers[r].send_frame(payload)
        result = [payload if r == self.rank else self._peers[r].recv_frame() for r in group]
        self._flush(others)
        return result

    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        if self.rank != root:
            self._peers[root].send_frame(payload)
            self._peers[root].flush()
            return None
        return [payload if r == root else self._peers[r].recv_frame() for r in group]

    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        if self.rank != root:
            return self._peers[root].recv_frame()
        assert payload is not None
        others = [r for r in group if r != root]
        for r in others:
            self._peers[r].send_frame(payload)
        self._flush(others)
        return payload

    def wait_for_activity(self, timeout: float | None, wake_fd: int, driver: bool = False) -> bool:
        with self._selector_lock:  # the engine thread and a driving caller may both get here first
            selector = self._selectors.get(driver)
            if selector is None:
                selector = self._selectors[driver] = selectors.DefaultSelector()
                selector.register(wake_fd, selectors.EVENT_READ, None)
                for peer in self._peers.values():
                    selector.register(peer.sock, selectors.EVENT_READ, peer.rank)
        events = selector.select(timeout)
        return any(key.data is not None for key, _ in events)

    def activity_fds(self, driver: bool) -> dict[int, bool]:
        return {peer.sock.fileno(): True for peer in self._peers.values()}

    def close(self) -> None:
        for selector in self._selectors.values():
            selector.close()
        self._selectors.clear()
        if self.deaths is not None:
            self.deaths.announce()
            self.deaths.close()
            self.deaths = None
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()


def _raise_if_lost(rendezvous: RendezvousClient) -> None:
    """Raise PeerFailure naming the first rank the launcher saw exit, if there is one."""
    try:
        lost = rendezvous.first_lost()
    except (OSError, wire.WireError):
        return
    if lost is not None:
        rank, host, what = lost
        raise PeerFailure(rank, f"{what}, so the job cannot be set up", host) from None  # the whole story


def _segment_bounds(total: int, counts: Sequence[int]) -> list[tuple[int, int]]:
    bounds, lo = [], 0
    for count in counts:
        bounds.append((lo, lo + int(count)))
        lo += int(count)
    if lo != total:
        raise ValueError(f"segment counts sum to {lo}, buffer holds {total}")
    return bounds

