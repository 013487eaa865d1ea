"""Direct exchanges: every member sends straight to every member that needs its data.

One network latency per collective instead of a ring's 2(n-1), at the cost of more bytes on the
wire: the choice for small allreduces, and the natural shape of allgather, alltoall and
broadcast, whose data goes from one member to another unchanged. Everything is sent before
anything is received (a sender thread pushes large sends), so no member waits on another's order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.common.algorithms.primitives import PointToPoint, Scratch, segment_bounds
from horovod.common.reduce_ops import reduce_into


def allreduce(link: PointToPoint, group: Sequence[int], buf: np.ndarray, op: int, scratch: Scratch) -> None:
    """Every member sends its whole buffer to every other and reduces all of them locally."""
    others = [r for r in group if r != link.rank]
    for r in others:
        link.send(r, buf)
    landing = scratch.take(buf.nbytes * len(others), buf.dtype)
    received = {}
    for i, r in enumerate(others):
        part = landing[i * buf.size:(i + 1) * buf.size]
        link.recv_into(r, part)
        received[r] = part
    link.flush(others)
    # Reduce in member order so every rank computes bit-identical floating-point results.
    own = buf.copy() if group[0] != link.rank else buf
    first = buf if group[0] == link.rank else received[group[0]]
    if first is not buf:
        np.copyto(buf, first)
    for r in group[1:]:
        reduce_into(buf, own if r == link.rank else received[r], op)


def allgatherv(link: PointToPoint, group: Sequence[int], send: np.ndarray, recv: np.ndarray,
               counts: Sequence[int]) -> None:
    """Concatenate every member's `send` (member i contributes counts[i]) into `recv`."""
    bounds = segment_bounds(recv.size, counts)
    pos = group.index(link.rank)
    others = [r for r in group if r != link.rank]
    for r in others:
        link.send(r, send)
    lo, hi = bounds[pos]
    np.copyto(recv[lo:hi], send[: hi - lo])
    for i, r in enumerate(group):
        if r != link.rank:
            lo, hi = bounds[i]
            link.recv_into(r, recv[lo:hi])
    link.flush(others)


def broadcast(link: PointToPoint, group: Sequence[int], buf: np.ndarray, root: int) -> None:
    """Copy the global rank `root`'s `buf` into every member's `buf`."""
    if len(group) == 1 or buf.size == 0:
        return
    if link.rank == root:
        others = [r for r in group if r != root]
        for r in others:
            link.send(r, buf)
        link.flush(others)
    else:
        link.recv_into(root, buf)


def alltoallv(link: PointToPoint, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int],
              recv: np.ndarray, recv_counts: Sequence[int]) -> None:
    """Member i's block j (send_counts[j] elements) lands as block i of member j's `recv`."""
    s_bounds = segment_bounds(send.size, send_counts)
    r_bounds = segment_bounds(recv.size, recv_counts)
    pos = group.index(link.rank)
    others = [r for r in group if r != link.rank]
    for i, r in enumerate(group):
        if r != link.rank:
            lo, hi = s_bounds[i]
            link.send(r, send[lo:hi])
    (s_lo, s_hi), (r_lo, r_hi) = s_bounds[pos], r_bounds[pos]
    np.copyto(recv[r_lo:r_hi], send[s_lo:s_hi])
    for i, r in enumerate(group):
        if r != link.rank:
            lo, hi = r_bounds[i]
            link.recv_into(r, recv[lo:hi])
    link.flush(others)
