"""Adasum written straight from the paper's formula, for tests to compare the distributed one with,
and `AGREES`, a job that checks every rank's Adasum against it (run by each transport's tests)."""

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


# Every dtype, unfused and fused, against `adasum` above (the hierarchical transport averages inside a
# host first); reports the problems found, a digest of each result (identical bits on every rank)
# and the transport that ran it.
AGREES = r'''
import numpy as np
import horovod.numpy as hvd
from horovod.common import basics
from horovod.common.reduce_ops import SUPPORTED_DTYPES
from tests.support.adasum_reference import adasum

hvd.init()
r, n, local = hvd.rank(), hvd.size(), hvd.local_size()
problems = []
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-14}

def inputs(seed, shape, dtype):
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal(shape)
    return [(shared + 0.5 * rng.standard_normal(shape)).astype(SUPPORTED_DTYPES[dtype]) for _ in range(n)]

def expected(per_rank, bounds):
    if basics.runtime().transport.name == "hierarchical" and local > 1:  # average in a host, Adasum across
        hosts = [sum(v.astype(np.float64) for v in per_rank[h:h + local]) / local for h in range(0, n, local)]
        return adasum([h.astype(per_rank[0].dtype) for h in hosts], bounds)
    return adasum(per_rank, bounds)

def check(what, got, want, dtype):
    got, want = np.asarray(got, np.float64), want.astype(np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype]):
        problems.append(f"{what}: max error {np.max(np.abs(got - want)) if got.shape == want.shape else got.shape}")

digests = []
for dtype in ("float16", "bfloat16", "float32", "float64"):
    for seed, shape in enumerate([(1,), (3, 5), (1000,), (257, 1031)]):
        per_rank = inputs(seed, shape, dtype)
        out = hvd.allreduce(per_rank[r], op=hvd.Adasum, name=f"one.{dtype}.{seed}")
        check(f"unfused {dtype} {shape}", out, expected([v.reshape(-1) for v in per_rank], [(0, out.size)]).reshape(shape), dtype)
        digests.append(np.asarray(out).tobytes().hex()[:64])
    # Fused: small tensors of one dtype travel in one buffer; each keeps its own coefficients.
    shapes = [(4,), (2, 3), (17,), (1,), (64, 8)]
    per_tensor = [inputs(100 + i, s, dtype) for i, s in enumerate(shapes)]
    outs = hvd.grouped_allreduce([t[r] for t in per_tensor], op=hvd.Adasum, name=f"fused.{dtype}")
    for s, t, out in zip(shapes, per_tensor, outs):
        check(f"fused {dtype} {s}", out, expected([v.reshape(-1) for v in t], [(0, t[0].size)]).reshape(s), dtype)
        digests.append(np.asarray(out).tobytes().hex()[:64])
report(problems=problems, digests=digests, transport=basics.runtime().transport.name)
'''
