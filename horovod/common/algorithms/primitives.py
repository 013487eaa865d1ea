"""What every algorithm is written over: ordered byte streams between ranks, and reused scratch memory."""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class PointToPoint(Protocol):
    """Reliable, ordered streams between this rank and every other (a transport's connections).

    A send may return before its bytes have left (a sender thread pushes them while the caller
    receives), so algorithms call `flush` before they touch a buffer they sent from.
    """

    rank: int

    def send(self, rank: int, data: np.ndarray) -> None:
        """Start sending `data`'s bytes to `rank`; `data` must stay untouched until `flush`."""

    def recv_into(self, rank: int, view: np.ndarray) -> None:
        """Fill `view` with the next bytes `rank` sent us (blocks until they have all arrived)."""

    def flush(self, ranks: Sequence[int]) -> None:
        """Wait until everything sent to `ranks` has left (our own rank may be among them)."""


class Scratch:
    """Reused scratch memory (fresh large arrays cost a page fault per 4 KiB on first touch)."""

    def __init__(self) -> None:
        self._buf = np.empty(0, np.uint8)

    def take(self, nbytes: int, dtype: np.dtype) -> np.ndarray:
        """`nbytes` of scratch as an array of `dtype`; valid until the next call."""
        if self._buf.nbytes < nbytes:
            self._buf = np.empty(nbytes, np.uint8)
        return self._buf[:nbytes].view(dtype)


def segment_bounds(total: int, counts: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each member's block when blocks of `counts` are laid end to end over `total`."""
    bounds, lo = [], 0
    for count in counts:
        bounds.append((lo, lo + int(count)))
        lo += int(count)
    if lo != total:
        raise ValueError(f"segment counts sum to {lo}, buffer holds {total}")
    return bounds
