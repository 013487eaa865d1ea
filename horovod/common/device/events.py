"""CUDA events, recycled: how work on one stream waits for work on another without the host.

A framework's tensor is ready on its stream when it is submitted: an event recorded there
(`mark_ready`) is what the engine's stream waits on before it reads the tensor. Once a stream
has been told to wait on an event, the event may be recorded again: the wait holds the moment
it was queued. So a handful of events serves any number of ops.
"""

from __future__ import annotations

import threading

from horovod.common.device.buffers import DeviceBuffer
from horovod.common.device.cuda_runtime import CudaRuntime, runtime


class EventPool:
    """Free events per device; `take` creates one when none is free."""

    def __init__(self, cuda: CudaRuntime) -> None:
        self.cuda = cuda
        self._free: dict[int, list[int]] = {}
        self._lock = threading.Lock()

    def take(self, device: int) -> int:
        with self._lock:
            free = self._free.setdefault(device, [])
            if free:
                return free.pop()
        current = self.cuda.current_device()
        if current == device:
            return self.cuda.create_event()
        self.cuda.set_device(device)  # an event belongs to the device that is current when it is made
        try:
            return self.cuda.create_event()
        finally:
            self.cuda.set_device(current)

    def give(self, device: int, event: int) -> None:
        with self._lock:
            self._free.setdefault(device, []).append(event)


_pool: EventPool | None = None


def pool() -> EventPool:
    global _pool
    if _pool is None:
        cuda = runtime()
        if cuda is None:
            raise RuntimeError("device tensors need the CUDA runtime library (libcudart), and none could be loaded")
        _pool = EventPool(cuda)
    return _pool


def mark_ready(buffer: DeviceBuffer) -> None:
    """Record on the buffer's stream that everything queued there so far (what computes the
    tensor) must finish before the engine reads it."""
    events = pool()
    buffer.ready = events.take(buffer.device)
    events.cuda.record(buffer.ready, buffer.stream)
