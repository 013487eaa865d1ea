"""ShmTransport: shared memory among the ranks of this host, TCP for everything that crosses hosts."""

from __future__ import annotations

import os
import socket
from typing import Sequence

import numpy as np

from horovod.common.logging import log
from horovod.common.reduce_ops import scale_in_place
from horovod.common.settings import Settings
from horovod.common.transport.activity import PeerActivity
from horovod.common.transport.base import Transport, TransportContext
from horovod.common.transport.shm.activity import ShmActivity
from horovod.common.transport.shm.collectives import Collectives
from horovod.common.transport.shm.mailbox import Mailbox
from horovod.common.transport.shm.placement import CoreShare
from horovod.common.transport.shm.segment import HostSegments, Unavailable
from horovod.common.transport.shm.signals import Signals
from horovod.common.transport.shm.staging import StagingChoice
from horovod.common.transport.tcp import TcpTransport

# The largest fusion region a segment reserves address space for.
_MAX_FUSION_BYTES = 1 << 30


class ShmTransport(Transport):
    """Shared memory among the ranks of this host, TCP for everything that crosses hosts.

    The TCP mesh is always built: it carries collectives whose members span hosts, control
    messages too large for a mailbox, and it is how a crashed peer is noticed. `shm` (the on-host
    collectives) is None when this host has one rank or shared memory is unavailable.
    """

    name = "shm"

    def __init__(self, context: TransportContext) -> None:
        rank, size = context.rank, context.size
        super().__init__(context)
        self.tcp = TcpTransport(context)
        self.host: HostSegments | None = None
        self.signals: Signals | None = None
        self.mailbox: Mailbox | None = None
        self.shm: Collectives | None = None
        self.cores = CoreShare()
        self._activity: PeerActivity = self.tcp.activity  # until shared memory is set up
        self._closed = False
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
        if len(self.local_ranks) > 1:
            try:
                self._open(min(context.settings.fusion_threshold, _MAX_FUSION_BYTES), context.settings)
            except Unavailable as exc:
                log.warning("rank %d: shared memory is unavailable (%s); ranks on this host talk over TCP",
                            rank, exc)
            except BaseException:
                self.tcp.close()
                raise
        # Per group: where its collectives and its control messages go.
        self._routes: dict[tuple[int, ...], tuple[Collectives | TcpTransport, Mailbox | TcpTransport]] = {}

    def _open(self, fusion_bytes: int, settings: Settings) -> None:
        """Set up shared memory with the other ranks of this host (collectively)."""
        host = self.host = HostSegments(self.tcp, self.local_ranks, self.rank, fusion_bytes)
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        signals = self.signals = Signals(host, self.tcp, settings.peer_timeout_seconds,
                                         may_spin=len(self.local_ranks) <= cpus)
        if settings.cpu_binding:
            signals.own_core = self.cores.bind(host.me, len(self.local_ranks)) is not None
        self.mailbox = Mailbox(host, signals, self.tcp)
        self.shm = Collectives(host, signals, StagingChoice(settings.shm_staging))
        signals.attach()
        assert host.bells is not None  # HostSegments raised without them
        self._activity = ShmActivity(self.tcp.activity, signals, host.bells)

    def _route(self, group: Sequence[int]) -> tuple[Collectives | TcpTransport, Mailbox | TcpTransport]:
        """Shared memory when every member of `group` is on this host (and it has 2+), else TCP."""
        key = tuple(group)
        route = self._routes.get(key)
        if route is None:
            if self.shm is not None and self.mailbox is not None and len(key) > 1 and self._local.issuperset(key):
                route = self._routes[key] = (self.shm, self.mailbox)
            else:
                route = self._routes[key] = (self.tcp, self.tcp)
        return route

    # -- data plane ---------------------------------------------------------------------------
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        self.allreduce_scaled(group, buf, op, 1.0)

    def allreduce_scaled(self, group: Sequence[int], buf: np.ndarray, op: int, postscale: float) -> None:
        if len(group) == 1 or buf.size == 0:
            scale_in_place(buf, postscale)
        elif self._route(group)[0] is self.shm:
            self.shm.allreduce(group, buf, op, postscale)
        else:
            self.tcp.allreduce_scaled(group, buf, op, postscale)

    def adasum(self, group: Sequence[int], buf: np.ndarray, bounds: Sequence[tuple[int, int]]) -> None:
        # Adasum is pairwise exchanges of halves: it runs over the mesh's point-to-point links,
        # on this host too (the shared-memory collectives have no point-to-point form).
        self.tcp.adasum(group, buf, bounds)

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> None:
        self._route(group)[0].allgatherv(group, send, recv, counts)

    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        if len(group) == 1 or buf.size == 0:
            return
        self._route(group)[0].broadcast(group, buf, root)

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int]) -> None:
        self._route(group)[0].alltoallv(group, send, send_counts, recv, recv_counts)

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                      op: int) -> None:
        self._route(group)[0].reducescatter(group, buf, recv, counts, op)

    def fusion_buffer(self, nbytes: int) -> np.ndarray | None:
        return self.host.fusion_buffer(nbytes) if self.host is not None else None

    # -- control plane ------------------------------------------------------------------------
    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        # Every cycle passes here, whatever its ops (small allreduces make no data call at all):
        # the one place to ask whether another process shares this rank's core.
        if self.cores.contended():
            self.signals.own_core = False
        return self._route(group)[1].exchange(group, payload)

    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        return self._route(group)[1].gather(group, payload, root)

    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        return self._route(group)[1].bcast_bytes(group, payload, root)

    @property
    def activity(self) -> PeerActivity:
        return self._activity

    def close(self) -> None:
        """Tell local peers we are gone, release the shared memory, close the mesh. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.signals is not None:
            self.signals.announce_closed()
        if self.shm is not None:
            self.shm.close()
        if self.host is not None:
            self.host.close()
        self.cores.release()
        self.tcp.close()
