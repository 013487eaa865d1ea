"""What the core knows of a tensor: where its memory lives, its address, size and type.

A buffer in host memory is a numpy array (the CPU path, unchanged: no wrapper per op). A buffer
in device memory is a `DeviceBuffer`, built once by the framework's bridge, which has validated
the tensor (dtype, layout, contiguity): below the bridges nobody asks which framework it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np

HOST = -1  # the device ordinal of host memory


@dataclass(eq=False)
class DeviceBuffer:
    """A contiguous tensor in the memory of CUDA device `device`.

    `stream` is the framework's stream the tensor is ready on when it is submitted; the op's
    result is ready on that same stream (it waits for the engine's event), so the caller never
    waits on the host. `owner` keeps the framework's tensor, and so the memory, alive while the
    op runs. `allocate(shape)` makes a new buffer of this dtype on the same device and stream,
    through the framework's allocator (outputs whose shape only negotiation tells).
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: str  # our dtype name (`reduce_ops.DTYPE_NAMES`)
    itemsize: int
    device: int
    stream: int
    owner: Any
    allocate: Callable[[tuple[int, ...]], "DeviceBuffer"]
    ready: int = 0  # an event recorded on `stream` at submission (`events.mark_ready`)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def at(self, offset_elements: int) -> int:
        """The address of element `offset_elements` of the flattened tensor."""
        return self.ptr + offset_elements * self.itemsize


Buffer = Union[np.ndarray, DeviceBuffer]


def device_of(buffer: Buffer | None) -> int:
    """The device ordinal of a buffer's memory; `HOST` for host memory."""
    return buffer.device if isinstance(buffer, DeviceBuffer) else HOST
