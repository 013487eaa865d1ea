"""The device transport interface: collectives on device memory, queued on a CUDA stream.

A device transport moves bytes that live in GPU memory. Its calls only *queue* work on its
`stream` and return; the engine records an event after them, and the callers' streams wait on
that event, so nobody waits on the host. It has no control messages and knows nothing of the
engine's sleeping and waking: negotiation stays on the host transport.

Buffers are device addresses (ints) with element counts and one of our dtype names. Reductions
take Horovod's op codes, Average included, with its pre- and postscale factors: a transport folds
them into its reduction where it can (`reductions.plan`), and the engine sends it only what it
said it takes (`unsupported`); everything else is staged through host memory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from horovod.common.engine.messages import Response


class DeviceTransport(ABC):
    """Moves device memory between the members of a group for one round of the job."""

    name: str = "abstract"
    stream: int = 0  # the CUDA stream its work is queued on
    device: int = -1  # the CUDA device ordinal its communicators use

    @abstractmethod
    def unsupported(self, response: Response, group: Sequence[int]) -> str:
        """Why this transport cannot run `response` over `group` ('' when it can). Every member
        gets the same answer from the same response, so all of them take the same route."""

    @abstractmethod
    def allreduce(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int], op: int,
                  prescale: float, postscale: float) -> None:
        """Reduce the tensors laid end to end at `send` (counts[i] elements each) into `recv`
        (which may be `send`): op, then scaled as Horovod scales (Average divides by the group)."""

    @abstractmethod
    def allgatherv(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int]) -> None:
        """Member i's counts[i] elements land at their offset in every member's `recv`."""

    @abstractmethod
    def broadcast(self, group: Sequence[int], buf: int, dtype: str, count: int, root: int) -> None:
        """The global rank `root`'s `count` elements, into every member's `buf`."""

    @abstractmethod
    def alltoallv(self, group: Sequence[int], send: int, send_counts: Sequence[int], recv: int,
                  recv_counts: Sequence[int], dtype: str) -> None:
        """Member i's block j (send_counts[j] elements) lands as block i of member j's `recv`."""

    @abstractmethod
    def reducescatter(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int], op: int,
                      prescale: float, postscale: float) -> None:
        """Reduce `send` across the group; member i gets block i (counts[i] elements) in `recv`."""

    def abort(self) -> None:
        """A peer failed: stop queued work that waits for it, now (from any thread)."""

    @abstractmethod
    def close(self) -> None:
        """Release communicators, streams and memory. Safe to call twice."""
