"""Authenticated connections: a mutual HMAC challenge-response, then length-prefixed frames.

Every socket between khorovod processes (worker <-> rendezvous store, worker <-> worker) starts
with `handshake()`. Both sides prove knowledge of the job's secret without sending it, so a
stranger (or a worker of another job) is refused before it can send a single message. After the
handshake, control messages travel as frames whose size is capped, so a peer cannot make us
allocate unbounded memory (nor make the decoder do it: see `decode`); payloads are MessagePack
(tuples, lists, dicts, str, bytes, numbers, bool, None), so no message can construct anything
else. MessagePack rather than pickle: its C decoder is five times faster than pickle's with the
checks pickle needs (a pickle of 20 bytes can make the unpickler grow its memo by gigabytes), and
it has nothing to check.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from typing import Any

import msgpack

MAGIC = b"KHVD\x01\x00\x00\x00"
NONCE_BYTES = 32
DIGEST_BYTES = 32
MAX_FRAME_BYTES = 256 * 1024 * 1024
_LEN = struct.Struct("<Q")
FRAME_HEADER_BYTES = _LEN.size


class WireError(ConnectionError):
    """The peer broke the protocol, closed the connection, or failed authentication."""


class AuthenticationError(WireError):
    """The peer does not know the job's secret key."""


def new_secret_key() -> bytes:
    return os.urandom(32)


def keepalive_options(seconds: float) -> dict[str, int]:
    """TCP options that make the kernel give up on a silent peer after about `seconds`.

    While a connection is idle, keepalive probes start after TCP_KEEPIDLE and repeat every
    TCP_KEEPINTVL; TCP_KEEPCNT unanswered ones end it. TCP_USER_TIMEOUT (milliseconds) bounds how
    long data we sent may stay unacknowledged, which covers a connection in the middle of a
    transfer, where keepalive never fires. Pure, so the arithmetic is tested on its own.
    """
    whole = max(1, int(seconds))
    interval = max(1, whole // 4)
    idle = max(1, whole - 3 * interval)
    return {"TCP_KEEPIDLE": idle, "TCP_KEEPINTVL": interval, "TCP_KEEPCNT": max(1, (whole - idle) // interval),
            "TCP_USER_TIMEOUT": max(1, int(seconds * 1000))}


def enable_liveness_checks(sock: socket.socket, seconds: float) -> None:
    """Let the kernel notice, within about `seconds`, a peer whose host stopped answering (a cut
    cable, a crashed machine): such a peer never closes its connection, so without this a read
    waits forever. Options this platform lacks are skipped (macOS names the idle time
    TCP_KEEPALIVE); `seconds` <= 0 keeps the kernel's defaults."""
    if seconds <= 0:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    except OSError:
        return
    for name, value in keepalive_options(seconds).items():
        option = getattr(socket, name, None)
        if option is None and name == "TCP_KEEPIDLE":
            option = getattr(socket, "TCP_KEEPALIVE", None)
        if option is None:
            continue
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
        except OSError:
            pass


def recv_exact(sock: socket.socket, nbytes: int) -> bytearray:
    buf = bytearray(nbytes)
    recv_into_exact(sock, memoryview(buf))
    return buf


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    view = view.cast("B")
    got = 0
    total = len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise WireError("connection closed by peer")
        got += n


def _digest(key: bytes, role: bytes, nonce_a: bytes, nonce_b: bytes) -> bytes:
    return hmac.new(key, role + nonce_a + nonce_b, hashlib.sha256).digest()


def handshake(sock: socket.socket, key: bytes, initiator: bool) -> None:
    """Mutually authenticate `sock` with the job secret; raise AuthenticationError on mismatch."""
    my_nonce = os.urandom(NONCE_BYTES)
    if initiator:
        sock.sendall(MAGIC + my_nonce)
        reply = recv_exact(sock, len(MAGIC) + NONCE_BYTES + DIGEST_BYTES)
        if bytes(reply[: len(MAGIC)]) != MAGIC:
            raise WireError("peer does not speak the khorovod protocol")
        their_nonce = bytes(reply[len(MAGIC) : len(MAGIC) + NONCE_BYTES])
        expected = _digest(key, b"acceptor", my_nonce, their_nonce)
        if not hmac.compare_digest(expected, bytes(reply[-DIGEST_BYTES:])):
            raise AuthenticationError("peer failed authentication (wrong secret key)")
        sock.sendall(_digest(key, b"initiator", my_nonce, their_nonce))
        return
    try:
        # The magic first, so a stranger speaking another protocol is named as such at once.
        if bytes(recv_exact(sock, len(MAGIC))) != MAGIC:
            raise WireError("peer does not speak the khorovod protocol")
        their_nonce = bytes(recv_exact(sock, NONCE_BYTES))
        sock.sendall(MAGIC + my_nonce + _digest(key, b"acceptor", their_nonce, my_nonce))
        proof = bytes(recv_exact(sock, DIGEST_BYTES))
    except WireError as exc:
        if "closed by peer" not in str(exc):
            raise
        raise WireError("peer closed the connection before it authenticated") from None
    if not hmac.compare_digest(proof, _digest(key, b"initiator", their_nonce, my_nonce)):
        raise AuthenticationError("peer failed authentication (wrong secret key)")


def _refuse_extension(code: int, data: bytes) -> Any:
    raise WireError(f"refused a message with a MessagePack extension type ({code})")


def encode(message: Any) -> bytes:
    """Serialise a message made of tuples, lists, dicts, str, bytes, numbers, bool and None."""
    return msgpack.packb(message, use_bin_type=True)


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The message `encode` made: sequences come back as tuples, and only plain values come back.
    Every length in the message is checked against the bytes that hold it before anything is
    allocated, so no message can make the decoder allocate more than its own size."""
    try:
        return msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=False, ext_hook=_refuse_extension,
                               timestamp=0)
    except WireError:
        raise
    except Exception as exc:
        raise WireError(f"malformed message: {exc}") from None


def frame_header(length: int) -> bytes:
    """The header that starts a frame of `length` bytes (for transports that send frames their own way)."""
    return _LEN.pack(length)


def frame_length(header: bytes | bytearray | memoryview) -> int:
    """The payload length a frame header of FRAME_HEADER_BYTES announces."""
    return _LEN.unpack(header)[0]


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LEN.pack(len(payload)) + payload if len(payload) < 65536 else _LEN.pack(len(payload)))
    if len(payload) >= 65536:
        sock.sendall(payload)


def recv_frame(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> bytearray:
    (length,) = _LEN.unpack(recv_exact(sock, _LEN.size))
    if length > max_bytes:
        raise WireError(f"peer announced a {length}-byte frame, above the {max_bytes}-byte limit")
    return recv_exact(sock, length)


def send_message(sock: socket.socket, message: Any) -> None:
    send_frame(sock, encode(message))


def recv_message(sock: socket.socket, max_bytes: int = MAX_FRAME_BYTES) -> Any:
    return decode(recv_frame(sock, max_bytes))
