"""Runs one agreed response on this rank: fusion-buffer packing, scaling, the transport call.

Every member executes the same responses in the same order, so the transport calls line up.
Responses on host memory run here; responses on device memory go to the `DeviceExecutor`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from horovod.common.engine.device_executor import DeviceExecutor
from horovod.common.engine.handles import Entry
from horovod.common.engine.messages import OpType, Response
from horovod.common.exceptions import HorovodInternalError
from horovod.common.algorithms.primitives import segment_bounds
from horovod.common.reduce_ops import SUPPORTED_DTYPES, Adasum, Average, Sum, reduce_into, scale_in_place
from horovod.common.settings import Settings
from horovod.common.transport.base import Transport

if TYPE_CHECKING:
    from horovod.common.timeline import Timeline


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _as_sum(response: Response, size: int) -> tuple[int, float]:
    """(the op to run, the factor to apply after it) for `size` members: Average is a Sum, then
    the postscale divided by the number of members."""
    if response.reduce_op == Average:
        return Sum, response.postscale / size
    return response.reduce_op, response.postscale


class Executor:
    def __init__(self, transport: Transport, settings: Settings, timeline: Timeline | None) -> None:
        self.transport = transport
        self.fusion_threshold = settings.fusion_threshold
        self.timeline = timeline
        self.device = DeviceExecutor(transport, settings)
        self._fusion = np.empty(0, np.uint8)
        self._allreduce_activity = f"{transport.name.upper()}_ALLREDUCE"  # built once, not per op

    def _fusion_bytes(self, nbytes: int) -> np.ndarray:
        """The persistent fusion buffer, grown once to the threshold and then reused (or the
        transport's own, when it offers one that it can read without a copy)."""
        shared = self.transport.fusion_buffer(nbytes)
        if shared is not None:
            return shared
        if self._fusion.nbytes < nbytes:
            self._fusion = np.empty(max(nbytes, min(self.fusion_threshold, 1 << 30)), np.uint8)
        return self._fusion[:nbytes]

    def _activity(self, names: list[str], activity: str | None) -> None:
        if self.timeline is not None and self.timeline.active:
            if activity is None:
                self.timeline.activity_end_all(names)
            else:
                self.timeline.activity_start_all(names, activity)

    def execute(self, response: Response, entries: list[Entry | None], members: tuple[int, ...],
                gathered: tuple[list[bytes], int] | None = None) -> None:
        """Run `response`; `gathered` (a lone small allreduce): every member's message in member
        order, each holding its contribution from that offset on (see `Cycle`)."""
        op = response.op_type
        timeline = self.timeline if self.timeline is not None and self.timeline.active else None
        if timeline is not None and op not in (OpType.ERROR, OpType.JOIN, OpType.BARRIER):
            for name in response.names:
                timeline.start_op(name, OpType(op).name)
        if gathered is not None:  # first: every small op of a training loop comes this way
            self._reduce_gathered(response, entries[0], members, *gathered)
        elif op == OpType.ERROR:
            for entry in entries:
                if entry is not None:
                    entry.finish(error=HorovodInternalError(response.error))
            return
        elif response.on_device:
            self.device.execute(response, entries, members)
        elif op == OpType.ALLREDUCE:
            self._allreduce(response, entries, members)
        elif op == OpType.ALLGATHER:
            self._allgather(response, entries[0], members)
        elif op == OpType.BROADCAST:
            self._broadcast(response, entries[0], members)
        elif op == OpType.ALLTOALL:
            self._alltoall(response, entries[0], members)
        elif op == OpType.REDUCESCATTER:
            self._reducescatter(response, entries[0], members)
        elif op == OpType.JOIN:
            for entry in entries:
                if entry is not None:
                    entry.finish(response.last_joined_rank)
            return
        elif op == OpType.BARRIER:
            for entry in entries:
                if entry is not None:
                    entry.finish(None)
            return
        if timeline is not None:
            for name, shape in zip(response.names, response.shapes):
                timeline.end_op(name, response.dtype, tuple(shape))

    def _allreduce(self, response: Response, entries: list[Entry | None], members: tuple[int, ...]) -> None:
        dtype = SUPPORTED_DTYPES[response.dtype]
        wire_op, postscale = _as_sum(response, len(members))
        activity = self._allreduce_activity
        if len(entries) == 1:
            entry = entries[0]
            if entry is None:  # joined rank: contribute zeros
                buf = np.zeros(_numel(response.shapes[0]), dtype)
            else:
                out = entry.output
                assert out is not None and entry.tensor is not None
                if out is not entry.tensor:
                    np.copyto(out, entry.tensor)
                buf = out if out.ndim == 1 else out.reshape(-1)
            if response.prescale != 1.0:
                scale_in_place(buf, response.prescale)
            traced = self.timeline is not None and self.timeline.active  # checked once: every op passes here
            if traced:
                self._activity(response.names, activity)
            self._reduce(members, buf, wire_op, [buf.size], postscale)
            if traced:
                self._activity(response.names, None)
            if entry is not None:
                entry.finish(out)
            return
        counts = [_numel(shape) for shape in response.shapes]
        fused = self._fusion_bytes(sum(counts) * dtype.itemsize).view(dtype)
        self._activity(response.names, "MEMCPY_IN_FUSION_BUFFER")
        offset = 0
        for entry, count in zip(entries, counts):
            if entry is None:
                fused[offset:offset + count] = 0
            else:
                fused[offset:offset + count] = entry.tensor.reshape(-1)
            offset += count
        self._activity(response.names, None)
        scale_in_place(fused, response.prescale)
        self._activity(response.names, activity)
        self._reduce(members, fused, wire_op, counts, postscale)
        self._activity(response.names, None)
        self._activity(response.names, "MEMCPY_OUT_FUSION_BUFFER")
        offset = 0
        for entry, count in zip(entries, counts):
            if entry is not None:
                entry.output.reshape(-1)[:] = fused[offset:offset + count]
            offset += count
        self._activity(response.names, None)
        for entry in entries:
            if entry is not None:
                entry.finish(entry.output)

    def _reduce_gathered(self, response: Response, entry: Entry | None, members: tuple[int, ...],
                         messages: list[bytes], offset: int) -> None:
        """A lone small allreduce from the contributions that came with the negotiation, reduced
        in member order on every rank, so that every rank ends with the same bits. Two members
        need no order (the operations are commutative): an in-place op then adds the peer's
        contribution to its own tensor, which is its contribution."""
        assert entry is not None and entry.output is not None  # a joined rank sends no contribution
        dtype = SUPPORTED_DTYPES[response.dtype]
        out = entry.output if entry.output.ndim == 1 else entry.output.reshape(-1)
        op, postscale = _as_sum(response, len(members))
        if len(members) == 2 and entry.output is entry.tensor and response.prescale == 1.0:
            peer = messages[1] if members[0] == self.transport.rank else messages[0]
            reduce_into(out, np.frombuffer(peer, dtype, offset=offset), op)
        else:
            np.copyto(out, np.frombuffer(messages[0], dtype, offset=offset))
            for message in messages[1:]:
                reduce_into(out, np.frombuffer(message, dtype, offset=offset), op)
        scale_in_place(out, postscale)
        entry.finish(entry.output)

    def _reduce(self, members: tuple[int, ...], buf: np.ndarray, op: int, counts: list[int],
                postscale: float) -> None:
        """The transport's allreduce, or its Adasum with each tensor's bounds in the buffer; then
        `buf` times `postscale` (the transport folds it into its last pass where it can)."""
        if op == Adasum:
            self.transport.adasum(members, buf, segment_bounds(buf.size, counts))
            scale_in_place(buf, postscale)
        else:
            self.transport.allreduce_scaled(members, buf, op, postscale)

    def _allgather(self, response: Response, entry: Entry | None, members: tuple[int, ...]) -> None:
        assert entry is not None and entry.tensor is not None
        trailing = tuple(response.shapes[0][1:])
        row = _numel(trailing)
        first_dims = response.first_dims[0]
        out = np.empty((sum(first_dims),) + trailing, SUPPORTED_DTYPES[response.dtype])
        self._activity(response.names, f"{self.transport.name.upper()}_ALLGATHER")
        self.transport.allgatherv(members, entry.tensor.reshape(-1), out.reshape(-1),
                                  [d * row for d in first_dims])
        self._activity(response.names, None)
        entry.finish(out)

    def _broadcast(self, response: Response, entry: Entry | None, members: tuple[int, ...]) -> None:
        assert entry is not None and entry.output is not None and entry.tensor is not None
        if self.transport.rank == response.root_rank and entry.output is not entry.tensor:
            np.copyto(entry.output, entry.tensor)
        self._activity(response.names, f"{self.transport.name.upper()}_BCAST")
        self.transport.broadcast(members, entry.output.reshape(-1), response.root_rank)
        self._activity(response.names, None)
        entry.finish(entry.output)

    def _alltoall(self, response: Response, entry: Entry | None, members: tuple[int, ...]) -> None:
        assert entry is not None and entry.tensor is not None
        me = members.index(self.transport.rank)
        trailing = tuple(entry.tensor.shape[1:])
        row = _numel(trailing)
        send_rows = response.splits[me]
        recv_rows = [response.splits[src][me] for src in range(len(members))]
        out = np.empty((sum(recv_rows),) + trailing, entry.tensor.dtype)
        send = entry.tensor.reshape(-1)[: sum(send_rows) * row]
        self._activity(response.names, f"{self.transport.name.upper()}_ALLTOALL")
        self.transport.alltoallv(members, send, [r * row for r in send_rows], out.reshape(-1),
                                 [r * row for r in recv_rows])
        self._activity(response.names, None)
        entry.finish((out, np.asarray(recv_rows, np.int32)))

    def _reducescatter(self, response: Response, entry: Entry | None, members: tuple[int, ...]) -> None:
        assert entry is not None and entry.tensor is not None and entry.output is not None
        n = len(members)
        shape = response.shapes[0]
        row = _numel(shape[1:])
        counts = [(shape[0] // n + (i < shape[0] % n)) * row for i in range(n)]
        dtype = entry.tensor.dtype
        scratch = self._fusion_bytes(entry.tensor.nbytes).view(dtype)
        np.copyto(scratch, entry.tensor.reshape(-1))
        scale_in_place(scratch, response.prescale)
        wire_op, postscale = _as_sum(response, n)
        self._activity(response.names, f"{self.transport.name.upper()}_REDUCESCATTER")
        self.transport.reducescatter(members, scratch, entry.output.reshape(-1), counts, wire_op)
        self._activity(response.names, None)
        scale_in_place(entry.output.reshape(-1), postscale)
        entry.finish(entry.output)
