"""Adasum written straight from the paper's formula, for tests to compare the distributed one with."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def pair(a: np.ndarray, b: np.ndarray, bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    """(1 - a.b/2|a|^2) a + (1 - a.b/2|b|^2) b per tensor, in float64, stored in a's dtype."""
    out = np.empty_like(a)
    for lo, hi in bounds:
        x, y = a[lo:hi].astype(np.float64), b[lo:hi].astype(np.float64)
        dot, xx, yy = float(x @ y), float(x @ x), float(y @ y)
        ca = 1.0 - dot / (2 * xx) if xx >= 1e-8 else 1.0
        cb = 1.0 - dot / (2 * yy) if yy >= 1e-8 else 1.0
        out[lo:hi] = ca * x + cb * y
    return out


def adasum(vectors: Sequence[np.ndarray], bounds: Sequence[tuple[int, int]]) -> np.ndarray:
    """Rank 2i with 2i+1, then those results pairwise, until one is left (a power-of-two count)."""
    level = list(vectors)
    while len(level) > 1:
        level = [pair(a, b, bounds) for a, b in zip(level[::2], level[1::2])]
    return level[0]
