"""The transport interface: what the engine needs to move bytes between ranks.

Collectives run over a *group*: the sorted global ranks of a process set. Buffers are
contiguous 1-D numpy arrays owned by the caller; counts are in elements of the buffer's dtype.
Control messages (negotiation) are small `bytes` payloads. A transport raises `PeerFailure`
naming the rank when a peer dies, hangs past the timeout, or breaks the protocol.
"""

from __future__ import annotations

import selectors
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from horovod.common.settings import Settings, Topology

if TYPE_CHECKING:
    from horovod.common.rendezvous import RendezvousClient

# BRIDGE (see Transport.wait_for_activity): how long the driver spins on has_activity() before it
# sleeps, when the transport says spinning can win (a rank that sleeps takes 30-60 us to wake here).
_BRIDGE_SPIN_SECONDS = 200e-6


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

    topology: Topology  # where this rank sits in THIS round
    settings: Settings
    rendezvous: RendezvousClient | None
    round: int  # the store's round number; scopes every key the transport publishes

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def store_host(self) -> str:
        return self.settings.rendezvous_addr or "127.0.0.1"


class Transport(ABC):
    """Moves bytes for one generation of the job (from `init()` to `shutdown()`)."""

    name: str = "abstract"

    def __init__(self, rank: int, size: int) -> None:
        self.rank = rank
        self.size = size
        self._bridge_selectors: dict[bool, selectors.BaseSelector] = {}  # BRIDGE, see wait_for_activity
        self._bridge_lock = threading.Lock()

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

    # -- activity: what the engine sleeps on (how it waits is its own policy) --------------
    spin_useful: bool = False
    """True when spinning on has_activity() can beat sleeping (every local rank has its own core)."""

    def has_activity(self) -> bool:
        """Non-blocking: a peer's control message waits that no file descriptor shows (mailboxes)."""
        return False

    def activity_fds(self, driver: bool) -> dict[int, bool]:
        """fd -> meaning, for the sleeper `driver` (the drive-lock holder) or the idle engine thread.
        True: the fd turning readable itself means a peer is talking to us (a peer's socket; also
        wakes on hang-up). False: a doorbell; after it rings, ask has_activity()."""
        return {}

    def listen(self, driver: bool, on: bool) -> None:
        """Around the engine's sleep on activity_fds(driver): lets peers ring this sleeper's bell."""

    def drain(self, driver: bool) -> None:
        """After waking: empty this sleeper's doorbell."""

    def wait_for_activity(self, timeout: float | None, wake_fd: int, driver: bool = False) -> bool:
        """BRIDGE on branch seams-shm until the engine's Waiter (engine/waiting.py) lands: block until
        a peer sent something, `wake_fd` is readable, or `timeout` passes; True when a peer talks."""
        if self.has_activity():
            return True
        if timeout != 0 and driver and self.spin_useful:  # the driver would block anyway: spin first
            spin = _BRIDGE_SPIN_SECONDS if timeout is None else min(_BRIDGE_SPIN_SECONDS, timeout)
            end = time.perf_counter() + spin
            while time.perf_counter() < end:
                if self.has_activity():
                    return True
        with self._bridge_lock:  # the engine thread and a driving caller may both get here first
            selector = self._bridge_selectors.get(driver)
            if selector is None:
                selector = self._bridge_selectors[driver] = selectors.DefaultSelector()
                selector.register(wake_fd, selectors.EVENT_READ, False)
                for fd, talking in self.activity_fds(driver).items():
                    selector.register(fd, selectors.EVENT_READ, talking)
        self.listen(driver, True)
        try:
            events = [] if self.has_activity() else selector.select(timeout)
        finally:
            self.listen(driver, False)
        self.drain(driver)
        return self.has_activity() or any(key.data for key, _ in events)

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
