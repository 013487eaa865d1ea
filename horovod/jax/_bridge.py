"""JAX arrays <-> the numpy arrays the core moves, inside and outside `jax.jit`.

Outside a transformation a JAX array converts to numpy directly. Inside `jit` the values are
tracers without data, so the host work runs in one `jax.pure_callback` per call: the traced
function stays pure, and the callback receives (and returns) numpy arrays of the shapes and
dtypes the trace already knows.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np


def is_traced(values: Sequence[Any]) -> bool:
    """True inside a jax transformation (jit), where values are tracers without data."""
    return any(isinstance(v, jax.core.Tracer) for v in values if v is not None)


def host_callback(host_fn: Callable[..., Sequence[np.ndarray]], tensors: Sequence[Any]) -> list[Any]:
    """`host_fn(*arrays)` run on the host from traced code; its outputs keep the inputs' shapes
    and dtypes (one output per input, as a reduction has)."""
    shapes = [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors]
    return list(jax.pure_callback(host_fn, shapes, *tensors))
