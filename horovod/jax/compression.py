"""Gradient compression for JAX arrays: `Compression.none`, `.fp16`, `.bf16`.

The scheme is `horovod.common.compression.CastCompressor` (floating-point arrays travel in a
smaller dtype, integer and bool arrays unchanged); this module only says how JAX casts.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor


class _JaxCast(CastCompressor):
    @staticmethod
    def _float_dtype(tensor: Any) -> Any:
        return tensor.dtype if jnp.issubdtype(tensor.dtype, jnp.floating) else None

    @staticmethod
    def _cast(tensor: Any, dtype: Any) -> Any:
        return tensor.astype(dtype)


class FP16Compressor(_JaxCast):
    """Half the bytes; float16 keeps 11 bits of mantissa but overflows above 65504."""

    wire_dtype = jnp.dtype(jnp.float16)


class BF16Compressor(_JaxCast):
    """Half the bytes with float32's range (8 bits of mantissa): large gradients cannot overflow."""

    wire_dtype = jnp.dtype(jnp.bfloat16)


class Compression:
    """The compressors by name."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
