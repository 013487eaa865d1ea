"""One framed, authenticated connection to a peer, with a sender thread for large sends."""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Sequence

import numpy as np

from horovod.common import wire
from horovod.common.settings import DEFAULT_FAILURE_DETECTION_SECONDS
from horovod.common.transport.base import PeerFailure
from horovod.common.transport.tcp.deathwatch import CLOSED_BY_PEER, UNREACHABLE, DeathWatch, unreachable

# Below this many bytes a message is sent from the calling thread (it fits in the socket buffers).
INLINE_SEND_BYTES = 64 * 1024


class PeerConnection:
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
        view = byte_view(data)
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
                    raise self._blame(f"accepted no data for {self.timeout:.0f} s (hung? HOROVOD_GLOO_TIMEOUT_SECONDS sets this limit)")
        if self._error is not None:
            raise self.failure(self._error)

    def recv_into(self, view: memoryview | np.ndarray) -> None:
        try:
            wire.recv_into_exact(self.sock, byte_view(view))
        except (OSError, wire.WireError) as exc:
            if isinstance(exc, socket.timeout) and exc.errno is None:  # our own timeout, not the kernel's
                raise self._blame(f"sent nothing for {self.timeout:.0f} s (hung? HOROVOD_GLOO_TIMEOUT_SECONDS sets this limit)") from None
            raise self.failure(exc) from None

    def send_frame(self, payload: bytes) -> None:
        header = wire.frame_header(len(payload))
        self.send(header + payload if len(payload) <= INLINE_SEND_BYTES else header)
        if len(payload) > INLINE_SEND_BYTES:
            self.send(payload)

    def recv_frame(self) -> bytes:
        header = bytearray(wire.FRAME_HEADER_BYTES)
        self.recv_into(header)
        length = wire.frame_length(header)
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
        if getattr(exc, "errno", None) in UNREACHABLE:
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



class PeerLinks:
    """A rank's connections as the `PointToPoint` that `horovod.common.algorithms` run over."""

    def __init__(self, rank: int, peers: dict[int, PeerConnection]) -> None:
        self.rank = rank
        self._peers = peers  # shared with the owner: connections added or closed there show here

    def send(self, rank: int, data: np.ndarray) -> None:
        self._peers[rank].send(data)

    def recv_into(self, rank: int, view: np.ndarray) -> None:
        self._peers[rank].recv_into(view)

    def flush(self, ranks: Sequence[int]) -> None:
        for r in ranks:
            if r != self.rank:
                self._peers[r].flush()


def byte_view(data: bytes | bytearray | memoryview | np.ndarray) -> memoryview:
    """Raw bytes of a buffer; numpy arrays of any dtype (float16, bfloat16 have no buffer format)."""
    if isinstance(data, np.ndarray):
        return memoryview(data.reshape(-1).view(np.uint8))
    return memoryview(data).cast("B")
