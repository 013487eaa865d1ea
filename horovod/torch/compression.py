"""Gradient compression: shrink a tensor before it is sent, restore it after it arrives.

A compressor is a class with two static methods, used as the class itself (no instance):
`compress(tensor) -> (compressed, ctx)` and `decompress(compressed, ctx) -> tensor`.
Only floating-point tensors are cast; integer and bool tensors pass through untouched.
"""

from __future__ import annotations

from typing import Any

import torch


class Compressor:
    """The interface; subclasses override both methods."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        raise NotImplementedError

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor


class _CastCompressor(Compressor):
    """Sends floating-point tensors as `wire_dtype`; ctx remembers the dtype to cast back to."""

    wire_dtype: torch.dtype

    @classmethod
    def compress(cls, tensor: torch.Tensor) -> tuple[torch.Tensor, Any]:  # type: ignore[override]
        if tensor.is_floating_point() and tensor.dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor:
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Half the bytes; float16 keeps 11 bits of mantissa but overflows above 65504."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Half the bytes with float32's range (8 bits of mantissa): no overflow in large gradients."""

    wire_dtype = torch.bfloat16


class Compression:
    """The compressors by name: `Compression.none`, `Compression.fp16`, `Compression.bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
