"""Fuzz targets: every parser that takes bytes or text from outside the process.

Each target takes one input (bytes) and either returns or raises the one error its contract
allows; anything else it raises is a crash. `run_fuzz.py` runs them under atheris (coverage
guided); `test_fuzz.py` runs each briefly in CI and replays the inputs that once crashed.

| target | what the input is | allowed error |
|---|---|---|
| `wire` | bytes a peer sends on any connection after the handshake: frames, then pickled messages | `WireError` |
| `store` | bytes a client sends the rendezvous store: without a handshake (a stranger), or after an honest one | none: the store refuses or drops the client, logs it, and goes on serving |
| `mesh` | a peer's handshake, or its greeting after an honest handshake, on a rank's data port | `WireError` (handshake), a refusal reason (greeting) |
| `elastic` | what the store holds for workers: round numbers, plans and how each round changed | `WireError` |
| `config` | a `--config-file` | `ValueError` |
| `hosts` | a hostfile, a `-H` value, a discovery script's output | `ValueError` |
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from typing import Callable

from horovod.common import wire
from horovod.common.bootstrap.store import CHANGES, decode_plan, newer_rounds
from horovod.common.rendezvous import ROUNDS, RendezvousClient, RendezvousServer
from horovod.common.transport.tcp.mesh import greeting_problem
from horovod.runner import config_file
from horovod.runner.elastic.discovery import parse_discovery_output
from horovod.runner.hosts import parse_hostfile_text, parse_hosts

KEY = b"k" * 32
MAX_INPUT = 1 << 16  # socket buffers hold it all, so a target never blocks on its own input

logging.getLogger("horovod").setLevel(logging.CRITICAL)  # refusals are expected by the thousand

# An exception that kills a thread of ours (a store connection's) is a crash of the target that
# started the thread: recorded here, raised by the target.
_thread_errors: list[BaseException] = []


def _record_thread_error(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None:
        _thread_errors.append(args.exc_value)


threading.excepthook = _record_thread_error


def _raise_thread_errors() -> None:
    if _thread_errors:
        error = _thread_errors.pop()
        _thread_errors.clear()
        raise AssertionError(f"a thread died of {type(error).__name__}: {error}") from error


def _read_messages(sock: socket.socket, max_bytes: int) -> None:
    """Decode messages from `sock` until its end; only `WireError` may stop it."""
    while True:
        wire.recv_message(sock, max_bytes)


def fuzz_wire(data: bytes) -> None:
    data = data[:MAX_INPUT]
    try:
        wire.decode(data)
    except wire.WireError:
        pass
    reader, writer = socket.socketpair()
    try:
        writer.sendall(data)
        writer.close()
        try:
            _read_messages(reader, 1 << 20)
        except wire.WireError:
            pass
    finally:
        reader.close()


def fuzz_store(data: bytes) -> None:
    """Input byte 0 even: a stranger sends the rest raw; odd: an honest handshake, then the rest."""
    data = data[:MAX_INPUT]
    server = RendezvousServer(KEY, "127.0.0.1", liveness_seconds=0)
    port = server.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            if data[:1] and data[0] % 2:
                wire.handshake(sock, KEY, initiator=True)
            sock.settimeout(0.2)  # the store answers at once, but for a `get` that waits for its key
            try:
                sock.sendall(data[1:])
                sock.shutdown(socket.SHUT_WR)
                while sock.recv(65536):  # replies, until the store drops us or answers everything
                    pass
            except socket.timeout:
                pass  # a `get` that waits for its key: stop() below ends it
            except OSError:
                pass  # dropped mid-send: a refusal
        honest = RendezvousClient("127.0.0.1", port, KEY, connect_timeout=5, liveness_seconds=0)
        try:
            honest.put("fuzz", "alive", b"1")
            assert honest.get("fuzz", "alive", 0.0) == b"1", "the store stopped serving honest clients"
        finally:
            honest.close()
    finally:
        server.stop()
    _raise_thread_errors()
    assert threading.active_count() < 50, f"{threading.active_count()} threads: the store leaks them"


def fuzz_mesh(data: bytes) -> None:
    """Input byte 0 even: a stranger's handshake; odd: an honest handshake, then a greeting."""
    data = data[:MAX_INPUT]
    acceptor, peer = socket.socketpair()
    acceptor.settimeout(5)
    peer.settimeout(5)
    honest = bool(data[:1]) and data[0] % 2 == 1

    def dial() -> None:
        try:
            if honest:
                wire.handshake(peer, KEY, initiator=True)
            peer.sendall(data[1:])
            peer.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # refused before all was sent

    dialer = threading.Thread(target=dial)
    dialer.start()
    try:
        try:
            wire.handshake(acceptor, KEY, initiator=False)
            hello = wire.recv_message(acceptor, max_bytes=1024)
        except wire.WireError:
            return
        assert honest, "a stranger got through the handshake"
        problem = greeting_problem(hello, rank=0, size=4, round_number=1, connected={2})
        assert problem is None or isinstance(problem, str)
        if problem is None:
            assert hello[1] in (1, 3) and hello[2] == 1, hello
    finally:
        acceptor.close()
        dialer.join()
        peer.close()


_elastic_store: tuple[RendezvousServer, RendezvousClient] | None = None


def fuzz_elastic(data: bytes) -> None:
    """The input: newline-separated `scope key value` records (value hex or raw) put in the store,
    then a worker looks for newer rounds and decodes the newest plan."""
    global _elastic_store
    if _elastic_store is None:
        server = RendezvousServer(KEY, "127.0.0.1", liveness_seconds=0)
        port = server.start()
        _elastic_store = server, RendezvousClient("127.0.0.1", port, KEY, connect_timeout=5, liveness_seconds=0)
    server, client = _elastic_store
    server.delete_scope(ROUNDS)
    server.delete_scope(CHANGES)
    for line in data[:MAX_INPUT].split(b"\n"):
        scope_byte, _, rest = line.partition(b" ")
        key, _, value = rest.partition(b" ")
        scope = ROUNDS if scope_byte[:1] in (b"r", b"") else CHANGES
        try:
            value = bytes.fromhex(value.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            pass
        server.put(scope, key.decode("utf-8", errors="replace"), value)
    for key in server.keys(ROUNDS):  # a round without a change record would cost a 1 s wait
        if server.get(CHANGES, key) is None:
            server.put(CHANGES, key, wire.encode(0))
    try:
        found = newer_rounds(client, after=0)
        if found is not None:
            decode_plan(client.get(ROUNDS, str(found[0]), 0.0))
    except wire.WireError:
        pass


def fuzz_config(data: bytes) -> None:
    with tempfile.NamedTemporaryFile("wb", suffix=".yaml", delete=False) as f:
        f.write(data[:MAX_INPUT])
    try:
        config_file.config_values(config_file.load(f.name), "fuzz.yaml")
    except ValueError:
        pass
    finally:
        os.unlink(f.name)


def fuzz_hosts(data: bytes) -> None:
    text = data[:MAX_INPUT].decode("utf-8", errors="replace")
    for parse in (lambda: parse_hostfile_text(text, "fuzz-hostfile"), lambda: parse_hosts(text),
                  lambda: parse_discovery_output(text, None, "fuzz-discovery"),
                  lambda: parse_discovery_output(text, 2, "fuzz-discovery")):
        try:
            for host in parse():
                assert isinstance(host.hostname, str) and host.hostname and host.slots >= 0, host
        except ValueError:
            pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "wire": fuzz_wire, "store": fuzz_store, "mesh": fuzz_mesh, "elastic": fuzz_elastic,
    "config": fuzz_config, "hosts": fuzz_hosts,
}


def seeds(name: str) -> list[bytes]:
    """Valid inputs of each target, for the fuzzer to start from."""
    frame = lambda message: wire.frame_header(len(wire.encode(message))) + wire.encode(message)  # noqa: E731
    if name == "wire":
        return [frame(("put", "s", "k", b"v")) + frame(("ok", [1, 2.5, None, {"a": (True,)}]))]
    if name == "store":
        requests = [("put", "s", "k", b"v"), ("get", "s", "k", 0.0), ("keys", "s"), ("delete", "s"), ("join", "w", 2)]
        return [b"\x01" + b"".join(frame(r) for r in requests), b"\x00GET / HTTP/1.1\r\n\r\n", b"\x00" + wire.MAGIC]
    if name == "mesh":
        return [b"\x01" + frame(("hello", 1, 1, "host-b")), b"\x01" + frame(("hello", 2, 1, "x")),
                b"\x00" + wire.MAGIC + bytes(64)]
    if name == "elastic":
        plan = wire.encode({"h:0": (0, 2, 0, 1, 0, 2, "h"), "g:0": (1, 2, 0, 1, 1, 2, "g")})
        return [b"r 1 " + plan.hex().encode() + b"\nc 1 " + wire.encode(2).hex().encode()]
    if name == "config":
        return [b"verbose: true\nparams:\n  fusion_threshold_mb: 32\n  cycle_time_ms: 5\ncontroller: gloo\n"
                b"timeline:\n  filename: /tmp/t.json\n  mark_cycles: false\nstall_check:\n  warning_time_seconds: 60\n"]
    if name == "hosts":
        return [b"node1 slots=2\n# comment\nnode2\n", b"h1:2,h2:4", b"a:1\nb\n"]
    raise KeyError(name)
