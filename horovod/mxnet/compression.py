"""Gradient compression for NDArrays: `Compression.none`, `.fp16`.

The scheme is `horovod.common.compression.CastCompressor`; this module only says how MXNet casts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor


class FP16Compressor(CastCompressor):
    """Half the bytes; float16 keeps 11 bits of mantissa but overflows above 65504."""

    wire_dtype = np.dtype(np.float16)

    @staticmethod
    def _float_dtype(tensor: Any) -> Any:
        dtype = np.dtype(tensor.dtype)
        return dtype if dtype.kind == "f" else None

    @staticmethod
    def _cast(tensor: Any, dtype: Any) -> Any:
        return tensor.astype(dtype)


class Compression:
    """The compressors by name (MXNet has no bfloat16 NDArrays)."""

    none = NoneCompressor
    fp16 = FP16Compressor


__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
