"""Adasum: adaptive summation of gradients (Maleki et al., MLSys 2021), by recursive vector halving.

Two gradients a and b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b: orthogonal
gradients add, parallel ones average, so a large batch needs no retuned learning rate. Every
tensor of a fused buffer gets its own coefficients (`bounds` says where each lies).

n members (a power of two) combine in log2(n) levels. At level d (1, 2, 4 ...) a member pairs
with the one d positions away, keeps half of the region it holds and sends the other half, so
each pair combines its two vectors with half the work each; the dot products and norms of a
level are partial sums over everyone's pieces, summed (in float64) among the 2d members whose
pieces make up the two vectors. The halves then travel back in reverse (distance halving), so
every element is computed by exactly one member and all members end with identical bits.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from horovod.common.algorithms.primitives import PointToPoint, Scratch

# A vector whose squared norm is below this keeps coefficient 1 (as Horovod's Adasum does).
NORM_FLOOR = 1e-8


def layout_error(members: int) -> str | None:
    """Why `members` ranks cannot run the flat algorithm (None when they can)."""
    if members & (members - 1):
        return (f"Adasum combines ranks pairwise and needs a power-of-two number of them; this set has "
                f"{members}. Run on 1, 2, 4, 8 ... ranks (or hosts, with the hierarchical transport)")
    return None


def coefficients(dot: np.ndarray, a_sq: np.ndarray, b_sq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-tensor (coefficient of a, coefficient of b) from float64 a.b, |a|^2 and |b|^2."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ca = np.where(a_sq >= NORM_FLOOR, 1.0 - dot / (2.0 * a_sq), 1.0)
        cb = np.where(b_sq >= NORM_FLOOR, 1.0 - dot / (2.0 * b_sq), 1.0)
    return ca, cb


def _clip(bounds: Sequence[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """Each tensor's part of [lo, hi), relative to lo (empty where a tensor lies outside)."""
    return [(min(max(t_lo, lo), hi) - lo, max(min(t_hi, hi), lo) - lo) for t_lo, t_hi in bounds]


def _partials(a: np.ndarray, b: np.ndarray, pieces: list[tuple[int, int]]) -> np.ndarray:
    """[a.b, |a|^2, |b|^2] per tensor over these pieces, in float64, laid out as 3 rows."""
    out = np.zeros((3, len(pieces)), np.float64)
    for t, (lo, hi) in enumerate(pieces):
        if hi > lo:
            x, y = a[lo:hi].astype(np.float64), b[lo:hi].astype(np.float64)
            out[0, t], out[1, t], out[2, t] = np.dot(x, y), np.dot(x, x), np.dot(y, y)
    return out


def _sum_among(link: PointToPoint, group: Sequence[int], pos: int, span: int, values: np.ndarray) -> np.ndarray:
    """Sum `values` over the `span` members of our aligned block (recursive doubling; the lower
    half's sum always comes first, so every member gets the same bits)."""
    incoming = np.empty_like(values)
    step = 1
    while step < span:
        peer = group[pos ^ step]
        link.send(peer, values)
        link.recv_into(peer, incoming)
        link.flush((peer,))
        values = values + incoming if pos & step == 0 else incoming + values
        step *= 2
    return values


def allreduce(link: PointToPoint, group: Sequence[int], buf: np.ndarray, bounds: Sequence[tuple[int, int]],
              scratch: Scratch) -> None:
    """Adasum of every member's `buf`, in place, identical on every member; `bounds` are the
    (start, end) of each tensor in `buf`. The group size must be a power of two."""
    n = len(group)
    if n == 1 or buf.size == 0:
        return
    error = layout_error(n)
    if error:
        raise ValueError(error)
    pos = group.index(link.rank)
    landing = scratch.take((buf.size - buf.size // 2) * buf.itemsize, buf.dtype)
    regions: list[tuple[int, int, int]] = []  # (lo, mid, hi) held before each level's split
    lo, hi = 0, buf.size
    distance = 1
    while distance < n:
        peer, left = group[pos ^ distance], pos & distance == 0
        mid = lo + (hi - lo) // 2
        regions.append((lo, mid, hi))
        (k_lo, k_hi), (s_lo, s_hi) = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
        kept, theirs = buf[k_lo:k_hi], landing[: k_hi - k_lo]
        link.send(peer, buf[s_lo:s_hi])
        link.recv_into(peer, theirs)
        link.flush((peer,))
        a, b = (kept, theirs) if left else (theirs, kept)
        pieces = _clip(bounds, k_lo, k_hi)
        dot, a_sq, b_sq = _sum_among(link, group, pos, 2 * distance, _partials(a, b, pieces))
        ca, cb = coefficients(dot, a_sq, b_sq)
        for t, (p_lo, p_hi) in enumerate(pieces):
            if p_hi > p_lo:
                x, y = a[p_lo:p_hi].astype(np.float64), b[p_lo:p_hi].astype(np.float64)
                kept[p_lo:p_hi] = ca[t] * x + cb[t] * y
        lo, hi = k_lo, k_hi
        distance *= 2
    for lo, mid, hi in reversed(regions):  # distance halving: hand the combined halves back
        distance //= 2
        peer, left = group[pos ^ distance], pos & distance == 0
        (k_lo, k_hi), (r_lo, r_hi) = ((lo, mid), (mid, hi)) if left else ((mid, hi), (lo, mid))
        link.send(peer, buf[k_lo:k_hi])
        link.recv_into(peer, buf[r_lo:r_hi])
        link.flush((peer,))
