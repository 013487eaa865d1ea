"""Horovod's reductions (op, prescale, postscale, Average's 1/n) as NCCL reduction ops.

Pure, so it is tested without a GPU. NCCL cannot scale after reducing, so factors fold into one
multiplier applied to each input before the sum (`ncclRedOpCreatePreMulSum`): for Sum and Average
this is the same arithmetic up to rounding. Where folding would change the result (a factor with
Min, Max or Product; a fractional factor on integers) or NCCL lacks the type (16-bit integers),
`plan` says why, and the engine stages that response through host memory instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from horovod.common.reduce_ops import OP_NAMES, Adasum, Average, Max, Min, Product, Sum
from horovod.common.transport.nccl.library import AVG, DATA_TYPES, MAX, MIN, PROD, SUM

_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
_NATIVE = {Sum: SUM, Min: MIN, Max: MAX, Product: PROD}


@dataclass(frozen=True)
class Reduction:
    """How to run one reduction on NCCL: a built-in op, or PreMulSum by `factor`."""

    nccl_dtype: int
    op: int  # a built-in ncclRedOp_t; ignored when `premul`
    premul: bool = False
    factor: float = 1.0


def plan(dtype: str, op: int, prescale: float, postscale: float, group_size: int) -> Reduction | str:
    """The NCCL reduction for Horovod's `op` on `dtype` over a group, or why there is none."""
    if dtype not in DATA_TYPES:
        return f"NCCL has no {dtype} type"
    nccl_dtype = DATA_TYPES[dtype]
    if op == Adasum:
        return "Adasum runs on the host (there is no NCCL Adasum)"
    scaled = prescale != 1.0 or postscale != 1.0
    if dtype == "bool":  # Sum and Max are logical or, Min and Product logical and
        return Reduction(nccl_dtype, MAX if op in (Sum, Max) else MIN)
    if op in (Min, Max, Product):
        if scaled:
            return f"NCCL cannot scale the result of {OP_NAMES[op]}"
        return Reduction(nccl_dtype, _NATIVE[op])
    factor = prescale * postscale / (group_size if op == Average else 1)
    if dtype in _FLOATS:
        return Reduction(nccl_dtype, SUM) if factor == 1.0 else Reduction(nccl_dtype, SUM, True, factor)
    if scaled:
        return "NCCL cannot scale integer tensors by a factor as Horovod does (in double precision)"
    return Reduction(nccl_dtype, AVG if op == Average and group_size > 1 else SUM)


def scalar_bytes(dtype: str, value: float) -> bytes:
    """`value` in the memory layout of `dtype` (PreMulSum's scalar has the tensor's type)."""
    if dtype == "bfloat16":  # the top half of float32, rounded to nearest even
        bits = int(np.array(value, np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return np.array(bits, np.uint16).tobytes()
    return np.array(value, np.dtype(dtype)).tobytes()
