"""The ring: a bandwidth-optimal allreduce (reduce-scatter, then allgather) for large buffers.

Member i owns segment i. In n-1 steps every member sends one segment to its right neighbour and
reduces the one arriving from its left, chunk by chunk as it lands, so sending, receiving and
reducing overlap; then n-1 more steps pass the reduced segments around. Each member sends
2(n-1)/n of the buffer whatever n is, but pays 2(n-1) latencies: below DIRECT_ALLREDUCE_BYTES a
direct exchange (`pairwise.allreduce`, one latency) wins.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.common.algorithms import pairwise
from horovod.common.algorithms.primitives import PointToPoint, Scratch, segment_bounds
from horovod.common.partition import even_counts
from horovod.common.reduce_ops import reduce_into

# Below this many bytes an allreduce is a direct exchange instead of a ring.
DIRECT_ALLREDUCE_BYTES = 256 * 1024
# Receive-and-reduce granularity of the ring: big enough to amortise calls, small enough to overlap.
RING_CHUNK_BYTES = 1024 * 1024


def allreduce(link: PointToPoint, group: Sequence[int], buf: np.ndarray, op: int, scratch: Scratch) -> None:
    """Reduce `buf` across the group, in place; identical bits on every member."""
    if len(group) == 1 or buf.size == 0:
        return
    if buf.nbytes <= DIRECT_ALLREDUCE_BYTES or buf.size < len(group):
        pairwise.allreduce(link, group, buf, op, scratch)
        return
    bounds = segment_bounds(buf.size, even_counts(buf.size, len(group)))
    reduce_scatter(link, group, buf, bounds, op, scratch)
    allgather(link, group, buf, bounds)


def reduce_scatter(link: PointToPoint, group: Sequence[int], buf: np.ndarray, bounds: list[tuple[int, int]],
                   op: int, scratch: Scratch) -> None:
    """Leaves member i holding the fully reduced segment i of `buf`."""
    n = len(group)
    pos = group.index(link.rank)
    right, left = group[(pos + 1) % n], group[(pos - 1) % n]
    chunk = max(1, RING_CHUNK_BYTES // buf.itemsize)
    landing = scratch.take(min(chunk, buf.size) * buf.itemsize, buf.dtype)
    for step in range(n - 1):
        s_lo, s_hi = bounds[(pos - step - 1) % n]
        r_lo, r_hi = bounds[(pos - step - 2) % n]
        link.send(right, buf[s_lo:s_hi])
        for lo in range(r_lo, r_hi, chunk):
            hi = min(lo + chunk, r_hi)
            part = landing[: hi - lo]
            link.recv_into(left, part)
            reduce_into(buf[lo:hi], part, op)
        link.flush((right,))


def allgather(link: PointToPoint, group: Sequence[int], buf: np.ndarray, bounds: list[tuple[int, int]]) -> None:
    """Member i holds segment i of `buf`; afterwards every member holds all of them."""
    n = len(group)
    pos = group.index(link.rank)
    right, left = group[(pos + 1) % n], group[(pos - 1) % n]
    for step in range(n - 1):
        s_lo, s_hi = bounds[(pos - step) % n]
        r_lo, r_hi = bounds[(pos - step - 1) % n]
        link.send(right, buf[s_lo:s_hi])
        link.recv_into(left, buf[r_lo:r_hi])
        link.flush((right,))


def reducescatter(link: PointToPoint, group: Sequence[int], buf: np.ndarray, recv: np.ndarray,
                  counts: Sequence[int], op: int, scratch: Scratch) -> None:
    """Reduce `buf` across the group (using it as scratch); member i gets block i (counts[i]) in `recv`."""
    bounds = segment_bounds(buf.size, counts)
    if len(group) > 1:
        reduce_scatter(link, group, buf, bounds, op, scratch)
    lo, hi = bounds[group.index(link.rank)]
    np.copyto(recv[: hi - lo], buf[lo:hi])
