"""The built-in transport: a full mesh of authenticated TCP connections.

Large allreduces run as a bandwidth-optimal ring (reduce-scatter, then allgather). Within a ring
step, a per-peer sender thread pushes our segment while this thread receives the neighbour's
segment chunk by chunk and reduces each chunk as it lands, so sending, receiving and reducing
overlap. Small messages skip the ring: every member sends its whole buffer to every other and
reduces locally in member order, which costs one network latency instead of 2(n-1).

The algorithms live in `horovod.common.algorithms`, run over the mesh's connections
(`PeerLinks`); this class composes them into the Transport methods.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.common.algorithms import Scratch, adasum, pairwise, ring
from horovod.common.transport.activity import PeerActivity
from horovod.common.transport.base import Transport, TransportContext
from horovod.common.transport.tcp.deathwatch import DeathWatch
from horovod.common.transport.tcp.mesh import Mesh
from horovod.common.transport.tcp.peer import PeerConnection, PeerLinks


class SocketActivity(PeerActivity):
    """A peer talks to us when its socket turns readable (a hang-up too): nothing else to watch."""

    def __init__(self, peers: dict[int, PeerConnection]) -> None:
        self._peers = peers

    def fds(self, driver: bool) -> dict[int, bool]:
        return {peer.sock.fileno(): True for peer in self._peers.values()}


class TcpTransport(Transport):
    """A full mesh of TCP connections (`Mesh`); collectives are `horovod.common.algorithms` over it."""

    name = "tcp"

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        self._scratch = Scratch()
        self._mesh = Mesh(context)
        self._peers = self._mesh.peers
        self._links = PeerLinks(self.rank, self._peers)
        self._activity = SocketActivity(self._peers)

    @property
    def deaths(self) -> DeathWatch | None:
        """Who failed first, once a connection closes (None where poll() cannot tell: not Linux)."""
        return self._mesh.deaths

    def peer(self, rank: int) -> PeerConnection:
        """The connection to `rank` (transports layered on this mesh use it for failure detection
        and for control frames too large for their own channels)."""
        return self._peers[rank]

    # -- data plane -------------------------------------------------------------------------
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        ring.allreduce(self._links, group, buf, op, self._scratch)

    def adasum(self, group: Sequence[int], buf: np.ndarray, bounds: Sequence[tuple[int, int]]) -> None:
        adasum.allreduce(self._links, group, buf, bounds, self._scratch)

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray,
                      counts: Sequence[int], op: int) -> None:
        ring.reducescatter(self._links, group, buf, recv, counts, op, self._scratch)

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray,
                   counts: Sequence[int]) -> None:
        pairwise.allgatherv(self._links, group, send, recv, counts)

    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        pairwise.broadcast(self._links, group, buf, root)

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int],
                  recv: np.ndarray, recv_counts: Sequence[int]) -> None:
        pairwise.alltoallv(self._links, group, send, send_counts, recv, recv_counts)

    # -- control plane ----------------------------------------------------------------------
    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        others = [r for r in group if r != self.rank]
        for r in others:
            self._peers[r].send_frame(payload)
        result = [payload if r == self.rank else self._peers[r].recv_frame() for r in group]
        self._links.flush(others)
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
        self._links.flush(others)
        return payload

    @property
    def activity(self) -> SocketActivity:
        return self._activity

    def close(self) -> None:
        self._mesh.close()

