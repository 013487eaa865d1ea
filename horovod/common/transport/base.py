"""The transport interface: what the engine needs to move bytes between ranks.

Collectives run over a *group*: the sorted global ranks of a process set. Buffers are
contiguous 1-D numpy arrays owned by the caller; counts are in elements of the buffer's dtype.
Control messages (negotiation) are small `bytes` payloads. A transport raises `PeerFailure`
naming the rank when a peer dies, hangs past the timeout, or breaks the protocol.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np


class PeerFailure(ConnectionError):
    """Communication with a specific rank failed; `rank` says which, `host` where it ran."""

    def __init__(self, rank: int, reason: str, host: str | None = None) -> None:
        super().__init__(f"rank {rank} on host {host} {reason}" if host else f"rank {rank} {reason}")
        self.rank = rank
        self.reason = reason
        self.host = host


class Transport(ABC):
    """Moves bytes for one generation of the job (from `init()` to `shutdown()`)."""

    name: str = "abstract"

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size

    # -- data plane -----------------------------------------------------------------------
    @abstractmethod
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        """Reduce `buf` element-wise across the group, in place, identical result on every member."""

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

    @abstractmethod
    def wait_for_activity(self, timeout: float | None, wake_fd: int, driver: bool = False) -> bool:
        """Block until a peer sent something, `wake_fd` is readable, or `timeout` passes.

        Returns True when a peer is talking to us (it has started a negotiation cycle). Reads
        nothing of the peer's message. Two threads may wait at once: the idle engine thread,
        and (`driver`) the thread that holds the engine's drive lock."""

    def set_caller_driving(self, on: bool) -> bool:
        """A framework thread that would otherwise only block drives the engine (on), or no
        longer does (off). Meanwhile the transport may spin longer before it sleeps, and peers
        need not wake the idle engine thread. Off returns True when a peer's message is waiting
        (the engine thread must be woken to answer it)."""
        return False

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
