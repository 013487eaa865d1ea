"""Device memory through the host transport: the route for what no device transport takes.

Each call copies the device bytes into page-locked host memory (one DMA), runs the host
transport's collective there, scales as the host path does, and copies the result back. The
host waits for the copies: this is host speed by construction, and it serves what NCCL cannot
(Adasum, 16-bit integers, scaled Min/Max/Product, ranks that share a GPU on an NCCL that refuses
it, `HOROVOD_GPU_OPERATIONS=MPI`), or every device tensor where no NCCL loads at all.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import numpy as np

from horovod.common.algorithms.primitives import segment_bounds
from horovod.common.device.cuda_runtime import CudaRuntime
from horovod.common.engine.messages import Response
from horovod.common.reduce_ops import SUPPORTED_DTYPES, Adasum, Average, Sum, scale_in_place
from horovod.common.transport.base import Transport
from horovod.common.transport.device import DeviceTransport


class StagedTransport(DeviceTransport):
    name = "staged"

    def __init__(self, host: Transport, cuda: CudaRuntime, device: int) -> None:
        self._host = host
        self._cuda = cuda
        self.device = device
        self.stream = cuda.create_stream()
        self._pinned = 0
        self._pinned_bytes = 0

    def unsupported(self, response: Response, group: Sequence[int]) -> str:
        return ""  # the host transport takes every dtype and op (its own checks ran at submit)

    def _staging(self, nbytes: int) -> int:
        """Page-locked host memory of at least `nbytes`, grown as needed and reused."""
        if nbytes > self._pinned_bytes:
            if self._pinned:
                self._cuda.free_host(self._pinned)
            self._pinned_bytes = max(nbytes, 2 * self._pinned_bytes)
            self._pinned = self._cuda.host_alloc(self._pinned_bytes)
        return self._pinned

    def _host_view(self, at: int, count: int, dtype: str) -> np.ndarray:
        dt = SUPPORTED_DTYPES[dtype]
        raw = (ctypes.c_uint8 * (count * dt.itemsize)).from_address(at)
        return np.frombuffer(raw, np.uint8).view(dt)

    def _down(self, src: int, count: int, dtype: str, extra: int = 0) -> np.ndarray:
        """The device bytes at `src` in host memory (with room for `extra` more elements after)."""
        itemsize = SUPPORTED_DTYPES[dtype].itemsize
        pinned = self._staging((count + extra) * itemsize)
        self._cuda.copy(pinned, src, count * itemsize, self.stream)
        self._cuda.synchronize(self.stream)
        return self._host_view(pinned, count + extra, dtype)

    def _up(self, dst: int, host: np.ndarray) -> None:
        self._cuda.copy(dst, host.ctypes.data, host.nbytes, self.stream)
        self._cuda.synchronize(self.stream)  # the staging memory is reused by the next call

    def allreduce(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int], op: int,
                  prescale: float, postscale: float) -> None:
        buf = self._down(send, sum(counts), dtype)
        scale_in_place(buf, prescale)
        post = postscale / len(group) if op == Average else postscale
        if op == Adasum:
            self._host.adasum(group, buf, segment_bounds(buf.size, counts))
            scale_in_place(buf, post)
        else:
            self._host.allreduce_scaled(group, buf, Sum if op == Average else op, post)
        self._up(recv, buf)

    def allgatherv(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int]) -> None:
        me = list(group).index(self._host.rank)
        total = sum(counts)
        staged = self._down(send, counts[me], dtype, extra=total)
        out = staged[counts[me]:]
        self._host.allgatherv(group, staged[:counts[me]], out, counts)
        self._up(recv, out)

    def broadcast(self, group: Sequence[int], buf: int, dtype: str, count: int, root: int) -> None:
        staged = self._down(buf, count, dtype)
        self._host.broadcast(group, staged, root)
        self._up(buf, staged)

    def alltoallv(self, group: Sequence[int], send: int, send_counts: Sequence[int], recv: int,
                  recv_counts: Sequence[int], dtype: str) -> None:
        sent = sum(send_counts)
        staged = self._down(send, sent, dtype, extra=sum(recv_counts))
        out = staged[sent:]
        self._host.alltoallv(group, staged[:sent], send_counts, out, recv_counts)
        self._up(recv, out)

    def reducescatter(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int], op: int,
                      prescale: float, postscale: float) -> None:
        me = list(group).index(self._host.rank)
        total = sum(counts)
        staged = self._down(send, total, dtype, extra=counts[me])
        buf, out = staged[:total], staged[total:]
        scale_in_place(buf, prescale)
        self._host.reducescatter(group, buf, out, counts, Sum if op == Average else op)
        scale_in_place(out, postscale / len(group) if op == Average else postscale)
        self._up(recv, out)

    def close(self) -> None:
        if self._pinned:
            self._cuda.free_host(self._pinned)
            self._pinned, self._pinned_bytes = 0, 0
        if self.stream:
            self._cuda.destroy_stream(self.stream)
            self.stream = 0
