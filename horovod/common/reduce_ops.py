"""Reduction operators and dtypes: the arithmetic every transport shares.

Op codes are Horovod's (`Average=0 ... Product=5`). Average is never a transport-level op: the
engine reduces with Sum and multiplies by 1/n afterwards, as Horovod's core does, so integer
averages truncate toward zero.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

Average = 0
"""`op=hvd.Average`: the sum over the ranks divided by their number (the default op)."""
Sum = 1
"""`op=hvd.Sum`: the sum over the ranks."""
Adasum = 2
"""`op=hvd.Adasum`: adaptive summation of gradients (docs/adasum.md)."""
Min = 3
"""`op=hvd.Min`: the element-wise minimum over the ranks."""
Max = 4
"""`op=hvd.Max`: the element-wise maximum over the ranks."""
Product = 5
"""`op=hvd.Product`: the element-wise product over the ranks."""
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}

try:  # bfloat16 has no numpy dtype of its own; ml_dtypes (shipped with JAX and TensorFlow) adds one.
    import ml_dtypes

    BFLOAT16: np.dtype | None = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16 = None

# Every dtype a collective moves, in the order error messages list them; each framework's bridge
# maps these names onto its own dtypes.
DTYPE_NAMES = ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool")
# Bytes per element, by name (bfloat16 included, with or without ml_dtypes).
DTYPE_SIZES = {"uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2, "bfloat16": 2,
               "float32": 4, "float64": 8, "bool": 1}
SUPPORTED_DTYPES: dict[str, np.dtype] = {
    name: BFLOAT16 if name == "bfloat16" else np.dtype(name)
    for name in DTYPE_NAMES if name != "bfloat16" or BFLOAT16 is not None
}


def is_bfloat16(dtype: np.dtype) -> bool:
    """True for ml_dtypes' bfloat16. Never `dtype == BFLOAT16` alone: without ml_dtypes BFLOAT16 is
    None, and numpy reads `dtype == None` as `dtype == float64`."""
    return BFLOAT16 is not None and dtype == BFLOAT16


# Supported dtypes by dtype object: numpy's `dtype.name` takes microseconds, and every collective asks.
_NAMES: dict[np.dtype, str] = {dtype: name for name, dtype in SUPPORTED_DTYPES.items()}


def dtype_name(dtype: np.dtype) -> str:
    """Our wire name of a dtype; ValueError (naming the supported ones) when we cannot move it."""
    known = _NAMES.get(dtype) if isinstance(dtype, np.dtype) else None
    if known is not None:
        return known
    name = np.dtype(dtype).name
    if name not in SUPPORTED_DTYPES:
        hint = " (install ml_dtypes for bfloat16)" if name == "bfloat16" else ""
        raise ValueError(
            f"tensor type {name} is not supported{hint}; supported types: {', '.join(SUPPORTED_DTYPES)}"
        )
    return name


def check_reducible(dtype_str: str, op: int) -> None:
    """Reject combinations that have no sensible meaning (averaging booleans, Adasum on ints)."""
    if op not in OP_NAMES:
        raise ValueError(f"unknown reduction op {op}; use one of {', '.join(OP_NAMES.values())}")
    if dtype_str == "bool" and op in (Average, Adasum):
        raise ValueError(f"{OP_NAMES[op]} of bool tensors has no meaning; use Sum, Min, Max or Product")
    if op == Adasum and not dtype_str.startswith(("float", "bfloat")):
        raise ValueError(f"Adasum combines gradients by their angle and needs floating-point tensors, got {dtype_str}")


def _bool_kernel(op: int) -> Callable[..., np.ndarray]:
    return np.logical_or if op in (Sum, Max) else np.logical_and


_KERNELS: dict[int, Callable[..., np.ndarray]] = {
    Sum: np.add,
    Average: np.add,
    Min: np.minimum,
    Max: np.maximum,
    Product: np.multiply,
}


def reduce_into(dst: np.ndarray, src: np.ndarray, op: int) -> None:
    """dst = dst (op) src, element-wise, in place (`dtype.kind`: `== np.bool_` builds a dtype per call)."""
    kernel = _bool_kernel(op) if dst.dtype.kind == "b" else _KERNELS[op]
    kernel(dst, src, out=dst)


def scale_in_place(buf: np.ndarray, factor: float) -> None:
    """Multiply by `factor` and store back in the element type, in Horovod's arithmetic so results
    are bit-identical to it: integers in float64 (then truncated toward 0), float16 and bfloat16
    in float32 with the factor rounded to float32, float32 in float32, float64 in float64."""
    if factor == 1.0:
        return
    if buf.dtype.kind in "iub":
        np.multiply(buf, np.float64(factor), out=buf, casting="unsafe")
    elif buf.dtype.itemsize == 2:  # float16 / bfloat16: never in their own precision
        wide = buf.astype(np.float32)
        wide *= np.float32(factor)
        buf[...] = wide
    else:
        np.multiply(buf, buf.dtype.type(factor), out=buf)
