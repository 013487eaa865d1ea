"""The transport interface: what the engine needs to move bytes between ranks.

Collectives run over a *group*: the sorted global ranks of a process set. Buffers are
contiguous 1-D numpy arrays owned by the caller; counts are in elements of the buffer's dtype.
Control messages (negotiation) are small `bytes` payloads. A transport raises `PeerFailure`
naming the rank when a peer dies, hangs past the timeout, or breaks the protocol.

Waiting for peers is the engine's business (`horovod.common.engine.waiting`): a transport only
hands it a `PeerActivity` (`activity`), which says what shows that a peer is talking and how to
be told.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from horovod.common.algorithms.adasum import layout_error as adasum_layout_error
from horovod.common.reduce_ops import scale_in_place
from horovod.common.rendezvous import RendezvousClient
from horovod.common.settings import Settings, Topology
from horovod.common.transport.activity import PeerActivity


class PeerFailure(ConnectionError):
    """Communication with a specific rank failed; `rank` says which, `host` where it ran."""

    def __init__(self, rank: int, reason: str, host: str | None = None) -> None:
        super().__init__(f"rank {rank} on host {host} {reason}" if host else f"rank {rank} {reason}")
        self.rank = rank
        self.reason = reason
        self.host = host


@dataclass(frozen=True)
class TransportContext:
    """Everything a transport needs to connect one round of the job."""

    topology: Topology  # this round's: who we are, who our peers are
    settings: Settings
    rendezvous: RendezvousClient | None  # None for a job of one
    round: int  # the store's round number; scopes every key the transport publishes
    communicator: Any = None  # the job's mpi4py communicator, when MPI started the job

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def store_host(self) -> str:
        """The rendezvous store's address: it tells which interface peers can reach us on."""
        return self.settings.rendezvous_addr or "127.0.0.1"


class Transport(ABC):
    """Moves bytes for one round of the job (from `init()` to `shutdown()`)."""

    name: str = "abstract"
    # Engine tunables (`horovod.common.engine.tunables.Tunables` field names) that are attributes
    # of this transport: the engine sets them when autotune changes them.
    tunable_knobs: tuple[str, ...] = ()
    # How large a lone small allreduce may be (its bytes times the group's size) for negotiation
    # to carry each member's contribution in its status message (`horovod.common.engine.cycle`):
    # one round trip instead of two, where a message costs about what a round trip does.
    eager_bytes: int = 16 * 1024

    def __init__(self, context: TransportContext) -> None:
        self.rank = context.rank
        self.size = context.size

    # -- data plane -----------------------------------------------------------------------
    @abstractmethod
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        """Reduce `buf` element-wise across the group, in place, identical result on every member."""

    def allreduce_scaled(self, group: Sequence[int], buf: np.ndarray, op: int, postscale: float) -> None:
        """`allreduce`, then multiply by `postscale` (`scale_in_place`). A transport that can scale
        each piece while it is still in cache, right after reducing it, overrides this: it saves a
        pass over the whole buffer (Average's 1/n on every gradient). The bits are the same."""
        self.allreduce(group, buf, op)
        if postscale != 1.0:  # Sum, on every op: not even a call
            scale_in_place(buf, postscale)

    @abstractmethod
    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray,
                   counts: Sequence[int]) -> None:
        """Concatenate every member's `send` (member i contributes counts[i]) into `recv`."""

    @abstractmethod
    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        """Copy the global rank `root`'s `buf` into every member's `buf`."""

    @abstractmethod
    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int],
                  recv: np.ndarray, recv_counts: Sequence[int]) -> None:
        """Member i's block j (send_counts[j] elements) lands as block i of member j's `recv`."""

    @abstractmethod
    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray,
                      counts: Sequence[int], op: int) -> None:
        """Reduce `buf` across the group; member i gets the i-th block (counts[i]) in `recv`.

        `buf` may be used as scratch space."""

    def adasum(self, group: Sequence[int], buf: np.ndarray, bounds: Sequence[tuple[int, int]]) -> None:
        """Adasum-combine `buf` across the group, in place, identical on every member; `bounds`
        are the (start, end) of each tensor in `buf` (each gets its own coefficients)."""
        raise NotImplementedError(f"the {self.name} transport does not implement op=Adasum")

    def adasum_error(self, group: Sequence[int]) -> str | None:
        """Why this transport cannot run Adasum over `group` (None when it can)."""
        if type(self).adasum is Transport.adasum:
            return f"the {self.name} transport does not implement op=Adasum"
        return adasum_layout_error(len(group))

    # -- control plane --------------------------------------------------------------------
    @abstractmethod
    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        """Every member sends `payload` to every other; returns all payloads in member order."""

    @abstractmethod
    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        """Members' payloads in member order at `root` (a global rank); None elsewhere."""

    @abstractmethod
    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        """`root`'s payload, on every member."""

    # -- telling the engine that a peer is talking ----------------------------------------
    @property
    @abstractmethod
    def activity(self) -> PeerActivity:
        """How the engine, asleep between cycles, learns that a peer has sent a control message."""

    def fusion_buffer(self, nbytes: int) -> np.ndarray | None:
        """A uint8 buffer of `nbytes` that this transport reads without a copy (shared memory),
        for the engine to pack fused tensors into; None means "use ordinary memory".
        Valid until the next call."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Release sockets, threads and shared memory. Safe to call twice."""

    def barrier(self, group: Sequence[int]) -> None:
        self.exchange(group, b"")
