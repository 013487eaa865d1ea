"""Gradient compression for any Keras 3 backend (casts through `keras.ops`)."""

from __future__ import annotations

from typing import Any

import keras

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor


class _KerasCast(CastCompressor):
    @staticmethod
    def _float_dtype(tensor: Any) -> Any:
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        return dtype if keras.backend.is_float_dtype(dtype) else None

    @staticmethod
    def _cast(tensor: Any, dtype: Any) -> Any:
        return keras.ops.cast(tensor, dtype)


class FP16Compressor(_KerasCast):
    """Half the bytes; float16 overflows above 65504."""

    wire_dtype = "float16"


class BF16Compressor(_KerasCast):
    """Half the bytes with float32's exponent range."""

    wire_dtype = "bfloat16"


class Compression:
    """The compressors by name."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def compression_name(compression: type[Compressor]) -> str | None:
    """'none', 'fp16' or 'bf16' for the built-in compressors of any framework (for configs)."""
    if compression is NoneCompressor:
        return "none"
    wire = getattr(compression, "wire_dtype", None)
    return {"float16": "fp16", "bfloat16": "bf16"}.get(getattr(wire, "name", wire))
