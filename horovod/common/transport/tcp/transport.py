"""The built-in transport: a full mesh of authenticated TCP connections.

Large allreduces run as a bandwidth-optimal ring (reduce-scatter, then allgather). Within a ring
step, a per-peer sender thread pushes our segment while this thread receives the neighbour's
segment chunk by chunk and reduces each chunk as it lands, so sending, receiving and reducing
overlap. Small messages skip the ring: every member sends its whole buffer to every other and
reduces locally in member order, which costs one network latency instead of 2(n-1).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.common.reduce_ops import reduce_into
from horovod.common.transport.base import Transport, TransportContext
from horovod.common.transport.tcp.deathwatch import DeathWatch
from horovod.common.transport.tcp.mesh import Mesh
from horovod.common.transport.tcp.peer import PeerConnection

# Below this many bytes an allreduce is a direct exchange instead of a ring.
DIRECT_ALLREDUCE_BYTES = 256 * 1024
# Receive-and-reduce granularity of the ring: big enough to amortise calls, small enough to overlap.
RING_CHUNK_BYTES = 1024 * 1024


class TcpTransport(Transport):
    name = "tcp"

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        self._scratch = np.empty(0, np.uint8)
        self._mesh = Mesh(context)
        self._peers = self._mesh.peers

    @property
    def deaths(self) -> DeathWatch | None:
        """Who failed first, once a connection closes (None where poll() cannot tell: not Linux)."""
        return self._mesh.deaths

    # -- primitives -------------------------------------------------------------------------
    def peer(self, rank: int) -> PeerConnection:
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

    def activity_fds(self, driver: bool) -> dict[int, bool]:
        return {peer.sock.fileno(): True for peer in self._peers.values()}

    def close(self) -> None:
        self._mesh.close()


def _segment_bounds(total: int, counts: Sequence[int]) -> list[tuple[int, int]]:
    bounds, lo = [], 0
    for count in counts:
        bounds.append((lo, lo + int(count)))
        lo += int(count)
    if lo != total:
        raise ValueError(f"segment counts sum to {lo}, buffer holds {total}")
    return bounds
