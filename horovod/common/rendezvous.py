"""The job's key-value store: served by the launcher, used by workers to find each other.

Workers publish their data-plane address under the job's scope and block (server side, no
polling) until the peers they need have published theirs. Every connection is authenticated
with the job secret (see `wire.handshake`); a stranger is logged and dropped while the job goes on.
The launcher also reads worker failure reports and `horovod.run` results from here, and
publishes what it knows that workers cannot see: which ranks have exited (`LOST`), so ranks still
setting up fail at once naming them instead of waiting out the start timeout. The store also
hands out round numbers (`horovod.common.rounds`): every `init()` joins a round, and what that
generation of the job publishes is scoped by it. Scopes and values: docs/internals.md.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Collection

from horovod.common import wire
from horovod.common.rounds import RoundBook
from horovod.common.settings import DEFAULT_FAILURE_DETECTION_SECONDS

log = logging.getLogger("horovod.rendezvous")

_PUT, _GET, _DELETE, _KEYS, _JOIN = "put", "get", "delete", "keys", "join"
#: Scope where a worker registers (key: its rank) when it calls hvd.init(); the launcher times the
#: start from the first registration (--start-timeout).
JOINED = "joined"
#: Scope where the launcher records ranks that are gone (key: rank; value: `encode_lost`).
LOST = "lost"
#: Scope of the planned rounds (key: the round number; value: the plan, see `RendezvousServer.open_round`).
ROUNDS = "rounds"


def encode_lost(order: int, host: str, what: str) -> bytes:
    """A `LOST` record: the `order`-th rank to go, the host it ran on, and how it went."""
    return wire.encode((order, host, what))


def decode_lost(value: bytes) -> tuple[int, str, str]:
    order, host, what = wire.decode(value)
    return int(order), str(host), str(what)


class RendezvousServer:
    """A threaded, authenticated KV store. `start()` returns the port it listens on."""

    def __init__(self, secret_key: bytes, host: str = "127.0.0.1",
                 liveness_seconds: float = DEFAULT_FAILURE_DETECTION_SECONDS) -> None:
        self._key = secret_key
        self._host = host
        self._liveness = liveness_seconds
        self._data: dict[tuple[str, str], bytes] = {}
        self._rounds = RoundBook()
        self._changed = threading.Condition()
        self._listener: socket.socket | None = None
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self.rejected_connections = 0

    def start(self, port: int = 0) -> int:
        self._listener = socket.create_server((self._host, port), backlog=128)
        thread = threading.Thread(target=self._accept_loop, name="hvd-rendezvous", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self._listener.getsockname()[1]

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None, "start() first"
        return self._listener.getsockname()[:2]

    def put(self, scope: str, key: str, value: bytes) -> None:
        with self._changed:
            self._data[(scope, key)] = bytes(value)
            self._changed.notify_all()

    def get(self, scope: str, key: str, timeout: float = 0.0) -> bytes | None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while (scope, key) not in self._data:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    return None
                self._changed.wait(remaining)
            return self._data[(scope, key)]

    def keys(self, scope: str) -> list[str]:
        with self._changed:
            return sorted(k for s, k in self._data if s == scope)

    def delete_scope(self, scope: str) -> None:
        with self._changed:
            for item in [item for item in self._data if item[0] == scope]:
                del self._data[item]

    def join_round(self, member: str, size: int) -> int:
        """The round a member of a fixed group of `size` joins now (`RoundBook.join`)."""
        with self._changed:
            return self._rounds.join(member, size)

    def open_round(self, members: Collection[str], plan: bytes) -> int:
        """Start a round of `members` a driver planned: its number, with `plan` (what each member
        is to do; the store does not read it) published under `ROUNDS/<number>`."""
        with self._changed:
            number = self._rounds.open(members)
            self.put(ROUNDS, str(number), plan)
        return number

    def stop(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._listener is not None:
            try:  # wakes the accept thread (closing alone leaves it blocked in accept() for good)
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(
                target=self._serve, args=(conn, peer), name="hvd-rendezvous-conn", daemon=True
            )
            thread.start()

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        self._conns.add(conn)
        try:
            wire.enable_liveness_checks(conn, self._liveness)
            conn.settimeout(10.0)
            try:
                wire.handshake(conn, self._key, initiator=False)
            except (wire.WireError, OSError) as exc:
                self.rejected_connections += 1
                log.warning("rendezvous: refused connection from %s: %s", peer, exc)
                return
            conn.settimeout(None)
            while True:
                try:
                    request = wire.recv_message(conn)
                    reply = self._handle(request)
                except wire.WireError as exc:
                    if "closed by peer" not in str(exc):
                        log.warning("rendezvous: dropped %s: %s", peer, exc)
                    return
                wire.send_message(conn, reply)
        except OSError:
            return
        finally:
            self._conns.discard(conn)
            conn.close()

    def _handle(self, request: Any) -> Any:
        if not (isinstance(request, tuple) and request and isinstance(request[0], str)):
            raise wire.WireError("malformed rendezvous request")
        op, args = request[0], request[1:]
        try:
            if op == _PUT:
                scope, key, value = args
                self.put(str(scope), str(key), bytes(value))
                return ("ok",)
            if op == _GET:
                scope, key, timeout = args
                return ("ok", self.get(str(scope), str(key), min(float(timeout), 3600.0)))
            if op == _DELETE:
                (scope,) = args
                self.delete_scope(str(scope))
                return ("ok",)
            if op == _KEYS:
                (scope,) = args
                return ("ok", self.keys(str(scope)))
            if op == _JOIN:
                member, size = args
                return ("ok", self.join_round(str(member), int(size)))
        except (TypeError, ValueError) as exc:
            raise wire.WireError(f"malformed rendezvous request: {exc}") from None
        raise wire.WireError(f"unknown rendezvous operation {op!r}")


class RendezvousClient:
    """A worker's connection to the launcher's store. Thread-safe; one request at a time."""

    def __init__(self, host: str, port: int, secret_key: bytes, connect_timeout: float = 30.0,
                 liveness_seconds: float = DEFAULT_FAILURE_DETECTION_SECONDS) -> None:
        self._lock = threading.Lock()
        self.address = (host, port)  # the store's, for messages
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                attempt = min(5.0, max(0.1, deadline - time.monotonic()))  # never past the deadline
                self._sock = socket.create_connection((host, port), timeout=attempt)
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"cannot reach the rendezvous store at {host}:{port} within {connect_timeout:g} s "
                        f"(HOROVOD_START_TIMEOUT; {exc}); is horovodrun still running, can this host reach it (network, firewall), "
                        "and is HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT right?"
                    ) from None
                time.sleep(0.05)
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.enable_liveness_checks(self._sock, liveness_seconds)
            wire.handshake(self._sock, secret_key, initiator=True)
        except BaseException:
            self._sock.close()
            raise
        self._sock.settimeout(None)

    def _call(self, *request: Any) -> Any:
        with self._lock:
            wire.send_message(self._sock, request)
            reply = wire.recv_message(self._sock)
        return reply[1] if len(reply) > 1 else None

    def put(self, scope: str, key: str, value: bytes) -> None:
        self._call(_PUT, scope, key, bytes(value))

    def get(self, scope: str, key: str, timeout: float) -> bytes:
        """Wait up to `timeout` seconds for the key; raise TimeoutError naming it if it never comes."""
        value = self._call(_GET, scope, key, timeout)
        if value is None:
            raise TimeoutError(f"rendezvous: no value for {scope}/{key} after {timeout:.0f} s")
        return value

    def keys(self, scope: str) -> list[str]:
        return self._call(_KEYS, scope)

    def delete_scope(self, scope: str) -> None:
        self._call(_DELETE, scope)

    def join_round(self, member: str, size: int) -> int:
        """The round this member of a fixed group of `size` joins (the store decides)."""
        return int(self._call(_JOIN, member, size))

    def rounds(self) -> list[int]:
        """The numbers of the rounds planned so far (`ROUNDS`); WireError if a key there is not one."""
        keys = self.keys(ROUNDS)
        if not all(key.isascii() and key.isdecimal() and str(int(key)) == key for key in keys):
            raise wire.WireError(f"malformed rendezvous store: round keys {keys!r:.200} are not all numbers")
        return [int(key) for key in keys]

    def first_lost(self) -> tuple[int, str, str] | None:
        """(rank, host, how it went) of the first rank the launcher saw go, or None."""
        records = [(decode_lost(self.get(LOST, key, 0.0)), int(key)) for key in self.keys(LOST)]
        if not records:
            return None
        (_, host, what), rank = min(records)
        return rank, host, what

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
