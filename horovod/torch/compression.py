"""Gradient compression for torch tensors: `Compression.none`, `.fp16`, `.bf16`.

The scheme is `horovod.common.compression.CastCompressor` (floating-point tensors travel in a
smaller dtype, integer and bool tensors unchanged); this module only says how torch casts.
"""

from __future__ import annotations

from typing import Any

import torch

from horovod.common.compression import CastCompressor, Compressor, NoneCompressor
from horovod.torch.powersgd import PowerSGD


class _TorchCast(CastCompressor):
    @staticmethod
    def _float_dtype(tensor: torch.Tensor) -> Any:
        return tensor.dtype if tensor.is_floating_point() else None

    @staticmethod
    def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return tensor.to(dtype)


class FP16Compressor(_TorchCast):
    """Half the bytes; float16 keeps 11 bits of mantissa but overflows above 65504."""

    wire_dtype = torch.float16


class BF16Compressor(_TorchCast):
    """Half the bytes with float32's range (8 bits of mantissa): large gradients cannot overflow."""

    wire_dtype = torch.bfloat16


class Compression:
    """The compressors by name."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def powersgd(**options: Any) -> PowerSGD:
        """PowerSGD low-rank compression with error feedback (a khorovod extension, for
        `DistributedOptimizer`); `options` are `horovod.torch.powersgd.PowerSGD`'s."""
        return PowerSGD(**options)


__all__ = ["BF16Compressor", "Compression", "Compressor", "FP16Compressor", "NoneCompressor"]
