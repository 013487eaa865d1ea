"""Framework-neutral gradient compression: the interface and the cast-to-a-smaller-dtype scheme.

A compressor is used as the class itself: `compressed, ctx = C.compress(tensor)`, send
`compressed`, then `C.decompress(received, ctx)`. A framework adapter subclasses
`CastCompressor` with its own `_float_dtype` and `_cast` and picks the wire dtype; everything
else (which tensors are cast, what the context holds) is decided here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class Compressor(ABC):
    """The interface: both methods are called on the class."""

    @classmethod
    @abstractmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        """(what to send, the context decompress needs)."""

    @classmethod
    @abstractmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        """The received tensor, restored with `ctx`."""


class NoneCompressor(Compressor):
    """Tensors travel unchanged."""

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        return tensor


class CastCompressor(Compressor):
    """Floating-point tensors travel as `wire_dtype` and are cast back on arrival; integer and
    bool tensors travel unchanged (ctx None)."""

    wire_dtype: Any = None

    @staticmethod
    @abstractmethod
    def _float_dtype(tensor: Any) -> Any:
        """The tensor's dtype when it is floating point, else None."""

    @staticmethod
    @abstractmethod
    def _cast(tensor: Any, dtype: Any) -> Any:
        """`tensor` converted to `dtype`, in the framework's own way."""

    @classmethod
    def compress(cls, tensor: Any) -> tuple[Any, Any]:
        dtype = cls._float_dtype(tensor)
        if dtype is None or dtype == cls.wire_dtype:
            return tensor, None
        return cls._cast(tensor, cls.wire_dtype), dtype

    @classmethod
    def decompress(cls, tensor: Any, ctx: Any) -> Any:
        return tensor if ctx is None else cls._cast(tensor, ctx)
