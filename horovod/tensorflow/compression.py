"""Gradient compression for TensorFlow tensors: `Compression.none`, `.fp16`, `.bf16`.

The scheme is `horovod.common.compression.CastCompressor`; this module only says how
TensorFlow casts.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor


class _TFCast(CastCompressor):
    @staticmethod
    def _float_dtype(tensor: Any) -> Any:
        return tensor.dtype if tensor.dtype.is_floating else None

    @staticmethod
    def _cast(tensor: Any, dtype: Any) -> Any:
        return tf.cast(tensor, dtype)


class FP16Compressor(_TFCast):
    """Half the bytes; float16 overflows above 65504."""

    wire_dtype = tf.float16


class BF16Compressor(_TFCast):
    """Half the bytes with float32's exponent range (and 8 bits of mantissa)."""

    wire_dtype = tf.bfloat16


class Compression:
    """The compressors by name."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
