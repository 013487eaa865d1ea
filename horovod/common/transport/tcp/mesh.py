"""Setting up the full mesh: publish our address, dial every lower rank, accept every higher one.

Every connection is authenticated with the job's secret (`wire.handshake`) and greeted with the
round it belongs to, so a stranger or a rank of another round is refused; every wait is bounded
by the start timeout, and a rank the launcher reports gone is named at once.
"""

from __future__ import annotations

import select
import selectors
import socket
import time
from typing import Any, Collection

from horovod.common import netif, wire
from horovod.common.rendezvous import RendezvousClient
from horovod.common.rounds import newest_round
from horovod.common.transport.base import PeerFailure, TransportContext
from horovod.common.transport.tcp.deathwatch import HANGUP, DeathWatch
from horovod.common.transport.tcp.peer import PeerConnection

SOCKET_BUFFER_BYTES = 4 * 1024 * 1024
# While waiting for peers at start-up, how often to ask the launcher whether a rank has gone.
SETUP_POLL_SECONDS = 0.25
# The launcher enforces the start timeout and names the rank that did not join; a rank's own
# deadline is this much later, a backstop for when the launcher cannot tell.
START_BACKSTOP_SECONDS = 2.0


class Mesh:
    """A connection to every other rank of one round, where each rank runs, and the death watch
    over those connections. Connected when built; nothing is left open if that fails."""

    def __init__(self, context: TransportContext) -> None:
        settings = context.settings
        self.rank, self.size = context.rank, context.size
        self.peers: dict[int, PeerConnection] = {}
        self.deaths: DeathWatch | None = None
        self.hostname = context.topology.hostname or socket.gethostname()
        self.hosts: dict[int, str] = {self.rank: self.hostname}  # where each rank runs, for messages
        self.detection_seconds = settings.failure_detection_seconds
        self.local_interfaces: list[netif.Interface] = []
        if self.size > 1:
            assert context.rendezvous is not None and settings.secret_key is not None
            try:
                self._connect(context.rendezvous, settings.secret_key, context.round,
                              netif.offered_addresses(context.store_host, settings.iface),
                              settings.start_timeout, settings.peer_timeout_seconds)
            except BaseException:
                self.close()
                raise

    def _connect(self, rendezvous: RendezvousClient, key: bytes, round_number: int, addresses: list[str],
                 start_timeout: float, peer_timeout: float) -> None:
        """Connect to every lower rank, accept every higher one. A rank the launcher reports gone
        fails this at once, naming it; otherwise the start timeout bounds every wait."""
        # Listen only where peers are told to connect (`netif`): loopback for a one-host job.
        listeners: list[socket.socket] = []
        try:
            for address in addresses:
                listeners.append(socket.create_server((address, 0), backlog=self.size))
        except OSError:
            for listener in listeners:
                listener.close()
            raise
        # epoll, not select(): a rank of a large job holds more than select()'s 1024 descriptors.
        incoming = selectors.DefaultSelector()
        for listener in listeners:
            incoming.register(listener, selectors.EVENT_READ)
        self.local_interfaces = netif.interfaces()  # to choose which of a peer's addresses to dial first
        scope = f"transport.{round_number}"
        offered = [listener.getsockname()[:2] for listener in listeners]
        rendezvous.put(scope, str(self.rank), wire.encode((offered, self.hostname)))
        deadline = time.monotonic() + start_timeout + START_BACKSTOP_SECONDS
        try:
            for peer in range(self.rank):
                sock = self._dial(rendezvous, scope, peer, deadline, start_timeout)
                wire.handshake(sock, key, initiator=True)
                wire.send_message(sock, ("hello", self.rank, round_number, self.hostname))
                self._add_peer(peer, sock, peer_timeout)
            while len(self.peers) < self.size - 1:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.rank + 1, self.size)) - set(self.peers))
                    raise TimeoutError(
                        f"ranks {missing} did not connect to rank {self.rank} within the start timeout "
                        f"({start_timeout:g} s); did they all start? (raise HOROVOD_START_TIMEOUT, --start-timeout, "
                        "if start-up is slow)")
                ready = incoming.select(SETUP_POLL_SECONDS)
                if not ready:
                    _raise_if_lost(rendezvous, round_number)
                    continue
                sock, addr = ready[0][0].fileobj.accept()  # type: ignore[union-attr]
                hello = self._greet(sock, key, round_number, deadline)
                if isinstance(hello, str):
                    from horovod.common.logging import log

                    log.warning("rank %d: refused a data connection from %s: %s", self.rank, addr, hello)
                    sock.close()
                    continue
                self.hosts[hello[1]] = hello[3]
                self._add_peer(hello[1], sock, peer_timeout)
        except (OSError, wire.WireError):
            _raise_if_lost(rendezvous, round_number)  # a peer gave up because of a rank that is gone: name that one
            raise
        finally:
            incoming.close()
            for listener in listeners:
                listener.close()
        for peer in self.peers.values():
            peer.sock.settimeout(peer_timeout)
        if HANGUP & getattr(select, "POLLRDHUP", 0):
            self.deaths = DeathWatch(self.rank, {r: peer.sock for r, peer in self.peers.items()}, rendezvous,
                                     scope, self.hosts, self.detection_seconds)
            for peer in self.peers.values():
                peer.deaths = self.deaths

    def _dial(self, rendezvous: RendezvousClient, scope: str, peer: int, deadline: float,
              start_timeout: float) -> socket.socket:
        """A connection to the lower rank `peer`, once it has published its address."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"rank {peer} did not join within the start timeout ({start_timeout:g} s); did it start? "
                    "Its output may say why (raise HOROVOD_START_TIMEOUT, --start-timeout, if start-up is slow).")
            try:
                address = rendezvous.get(scope, str(peer), min(SETUP_POLL_SECONDS, remaining))
                break
            except TimeoutError:
                _raise_if_lost(rendezvous, int(scope.rsplit(".", 1)[1]))
        offered, self.hosts[peer] = wire.decode(address)
        # Its listeners exist before its addresses are published: a host that is up answers at once.
        # The first address that answers wins (on a network this host shares, tried first).
        connect_timeout = max(1.0, self.detection_seconds)
        ports = {host: int(port) for host, port in offered}
        tried = []
        for peer_host in netif.dial_order(list(ports), self.local_interfaces):
            where = f"{peer_host}:{ports[peer_host]}"
            try:
                sock = socket.create_connection((peer_host, ports[peer_host]), timeout=connect_timeout)
                break
            except socket.timeout:
                tried.append(f"{where} did not answer within {connect_timeout:g} s")
            except OSError as exc:
                tried.append(f"{where}: {exc.strerror or exc}")
        else:
            raise PeerFailure(peer, f"could not be reached: {'; '.join(tried)} (network down, a firewall in the "
                              "way, or did it exit? --network-interfaces names the interfaces to use)",
                              self.hosts[peer])
        sock.settimeout(max(1.0, deadline - time.monotonic()))  # it accepts once its own dialling is done
        _tune(sock, self.detection_seconds)
        return sock

    def _greet(self, sock: socket.socket, key: bytes, round_number: int, deadline: float) -> tuple | str:
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
        problem = greeting_problem(hello, self.rank, self.size, round_number, self.peers)
        return hello if problem is None else problem

    def _add_peer(self, rank: int, sock: socket.socket, peer_timeout: float) -> None:
        self.peers[rank] = PeerConnection(rank, sock, peer_timeout, self.hosts.get(rank), self.detection_seconds)

    def close(self) -> None:
        """Say whom we blamed, if we failed, then close every connection. Safe to call twice."""
        if self.deaths is not None:
            self.deaths.announce()
            self.deaths.close()
            self.deaths = None
        for peer in self.peers.values():
            peer.close()
        self.peers.clear()


def greeting_problem(hello: Any, rank: int, size: int, round_number: int, connected: Collection[int]) -> str | None:
    """Why an authenticated peer's first message is not the greeting `("hello", rank, round, host)`
    of a higher rank of this round that has not connected yet; None when it is."""
    if not (isinstance(hello, tuple) and len(hello) == 4 and hello[0] == "hello"
            and type(hello[1]) is int and type(hello[2]) is int and isinstance(hello[3], str)):
        return f"unexpected greeting {hello!r:.80}"
    if hello[2] != round_number:
        return f"a greeting for round {hello[2]}, not this round ({round_number})"
    if not rank < hello[1] < size or hello[1] in connected:
        return f"a greeting from rank {hello[1]}, which is not a higher rank still to connect"
    return None


def _tune(sock: socket.socket, detection_seconds: float) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    wire.enable_liveness_checks(sock, detection_seconds)


def _raise_if_lost(rendezvous: RendezvousClient, round_number: int) -> None:
    """Raise PeerFailure naming the first rank the launcher saw exit, if there is one; or, when a
    driver has planned a newer round (a member of this one died or was left out), saying so."""
    try:
        lost = rendezvous.first_lost()
        newer = newest_round(rendezvous.rounds(), round_number)
    except (OSError, wire.WireError):
        return
    if newer is not None:
        raise TimeoutError(f"round {round_number} was superseded by round {newer} before all its members "
                           "connected (one is gone or was left out by the elastic driver)")
    if lost is not None:
        rank, host, what = lost
        raise PeerFailure(rank, f"{what}, so the job cannot be set up", host) from None  # the whole story
