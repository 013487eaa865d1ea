"""Runs one agreed response whose tensors live in device memory.

It picks the device transport for the response: NCCL where the whole group has it and it takes
the op, else the host transport through page-locked staging (saying once why). It fuses on the
device (device-to-device copies into a device fusion buffer) and completes by events: its stream
waits for each input's readiness event, the collective is queued, an event is recorded after it,
and each caller's stream waits for that event. The host does not wait for the GPU here.

Which transport serves a group is agreed once per group: the members exchange their NCCL
version and where their GPU is, so all of them take the same route or none does.
"""

from __future__ import annotations

import math
import socket
from typing import Sequence

import numpy as np

from horovod.common.device import events
from horovod.common.device.buffers import DeviceBuffer
from horovod.common.device.cuda_runtime import CudaRuntime, runtime
from horovod.common.engine.handles import Entry
from horovod.common.engine.messages import OpType, Response
from horovod.common.logging import log
from horovod.common.reduce_ops import DTYPE_SIZES
from horovod.common.settings import Settings
from horovod.common.transport.base import Transport
from horovod.common.transport.device import DeviceTransport
from horovod.common.transport.nccl import library
from horovod.common.transport.nccl.library import version_string
from horovod.common.transport.nccl.transport import NcclTransport
from horovod.common.transport.staged import StagedTransport

_OP_SETTING = {OpType.ALLREDUCE: "allreduce", OpType.ALLGATHER: "allgather", OpType.BROADCAST: "broadcast",
               OpType.ALLTOALL: "alltoall", OpType.REDUCESCATTER: "reducescatter"}


def group_route(places: Sequence[tuple[int, str, str]], multi_rank_gpu: bool) -> str:
    """Why a group cannot use NCCL ('' when it can), from each member's (NCCL version, host,
    GPU bus id). NCCL before 2.30 refuses two ranks on one GPU of one host."""
    missing = [i for i, (version, _, _) in enumerate(places) if not version]
    if missing:
        return f"NCCL could not be loaded on the group's members at positions {missing}"
    seen: dict[tuple[str, str], int] = {}
    for i, (version, host, bus) in enumerate(places):
        if (host, bus) in seen and not (version >= 23000 and multi_rank_gpu):
            return (f"members {seen[(host, bus)]} and {i} of the group share GPU {bus} on host {host}, which NCCL "
                    f"{version_string(version)} refuses (2.30 and later accept it with NCCL_MULTI_RANK_GPU_ENABLE=1); give each rank "
                    "its own GPU (torch.cuda.set_device(hvd.local_rank()), or CUDA_VISIBLE_DEVICES per rank) or each its own NCCL_HOSTID")
        seen[(host, bus)] = i
    return ""


class DeviceExecutor:
    """Device responses of one round: transports, fusion buffer and events, all made when first needed."""

    def __init__(self, host: Transport, settings: Settings) -> None:
        self._host = host
        self._settings = settings
        self.fusion_threshold = settings.fusion_threshold
        self._cuda: CudaRuntime | None = None
        self.device = -1  # the device this rank's transports use (its first device tensor's)
        self._nccl: NcclTransport | None = None
        self._nccl_why = ""  # why this rank has no NCCL transport
        self._staged: StagedTransport | None = None
        self._routes: dict[tuple[int, ...], str] = {}  # per group: '' (NCCL) or why not
        self._said: set[str] = set()
        self._fusion = 0
        self._fusion_bytes = 0

    @property
    def routes(self) -> dict[tuple[int, ...], str]:
        """Per group that ran a device collective: '' where NCCL serves it, else why not."""
        return dict(self._routes)

    # -- choosing the transport ------------------------------------------------------------
    def _start(self, device: int) -> CudaRuntime:
        cuda = self._cuda
        if cuda is None:
            cuda = runtime()
            if cuda is None:
                raise RuntimeError("a device collective needs the CUDA runtime library, and none loads here")
            self._cuda, self.device = cuda, device
            cuda.set_device(device)
            self._staged = StagedTransport(self._host, cuda, device)
            self._nccl, self._nccl_why = self._load_nccl(cuda, device)
        return cuda  # every device tensor of the rank is on `device` (Runtime.use_device)

    def _load_nccl(self, cuda: CudaRuntime, device: int) -> tuple[NcclTransport | None, str]:
        found = library.find(self._settings)
        if found.path is None:
            return None, found.why_not
        return NcclTransport(self._host, self._settings, cuda, library.load(found.path), device), ""

    def _route(self, response: Response, group: tuple[int, ...]) -> DeviceTransport:
        assert self._staged is not None and self._cuda is not None
        wanted = getattr(self._settings.gpu_operations, _OP_SETTING.get(OpType(response.op_type), "allreduce"))
        if wanted != "nccl":
            return self._staged_because(f"HOROVOD_GPU_{_OP_SETTING[OpType(response.op_type)].upper()} asks for the "
                                        "host transport")
        if group not in self._routes:
            nccl = self._nccl
            host = self._settings.nccl_hostid or socket.gethostname()
            mine = f"{nccl.version if nccl else 0}|{host}|{self._cuda.pci_bus_id(self.device)}"
            places = []
            for blob in self._host.exchange(group, mine.encode()):
                version, where, bus = blob.decode().split("|")
                places.append((int(version), where, bus))
            self._routes[group] = self._nccl_why or group_route(places, self._settings.nccl_multi_rank_gpu)
        why = self._routes[group]
        if why:
            return self._staged_because(f"NCCL is not used for ranks {list(group)}: {why}")
        assert self._nccl is not None
        if self._settings.hierarchical_allreduce and self._settings.topology.cross_size > 1:
            self._say_once("HOROVOD_HIERARCHICAL_ALLREDUCE applies to CPU tensors only: on GPU tensors NCCL runs "
                           "one communicator across the hosts")
        why = self._nccl.unsupported(response, group)
        return self._staged_because(why) if why else self._nccl

    def _staged_because(self, why: str) -> DeviceTransport:
        self._say_once(f"device tensors go through host memory: {why}")
        assert self._staged is not None
        return self._staged

    def _say_once(self, what: str) -> None:
        if what not in self._said:
            self._said.add(what)
            log.warning("rank %d: %s", self._host.rank, what)

    # -- running a response ----------------------------------------------------------------
    def execute(self, response: Response, entries: list[Entry | None], members: tuple[int, ...]) -> None:
        buffers = [e.tensor for e in entries if e is not None and isinstance(e.tensor, DeviceBuffer)]
        cuda = self._start(buffers[0].device if buffers else (self.device if self.device >= 0 else 0))
        transport = self._route(response, members)
        stream = transport.stream
        pool = events.pool()
        for buf in buffers:
            cuda.wait_event(stream, buf.ready)
            pool.give(buf.device, buf.ready)
        op = response.op_type
        if op == OpType.ALLREDUCE:
            results = self._allreduce(transport, response, entries, members)
        elif op == OpType.ALLGATHER:
            results = [self._allgather(transport, response, entries[0], members)]
        elif op == OpType.BROADCAST:
            results = [self._broadcast(transport, response, entries[0], members)]
        elif op == OpType.ALLTOALL:
            results = [self._alltoall(transport, response, entries[0], members)]
        else:
            results = [self._reducescatter(transport, response, entries[0], members)]
        done = pool.take(self.device)
        cuda.record(done, stream)
        for buf in buffers:
            cuda.wait_event(buf.stream, done)  # the caller's stream: later work there sees the result
        pool.give(self.device, done)
        for entry, result in zip(entries, results):
            if entry is not None:
                entry.finish(result)

    def _scratch(self, nbytes: int) -> int:
        """The device fusion buffer, grown to the threshold once and reused."""
        if nbytes > self._fusion_bytes:
            assert self._cuda is not None
            if self._fusion:  # queued copies and collectives may still use the old one
                for transport in (self._nccl, self._staged):
                    if transport is not None:
                        self._cuda.synchronize(transport.stream)
                self._cuda.free(self._fusion)
            self._fusion_bytes = max(nbytes, min(self.fusion_threshold, 1 << 30))
            self._fusion = self._cuda.malloc(self._fusion_bytes)
        return self._fusion

    def _allreduce(self, transport: DeviceTransport, response: Response, entries: list[Entry | None],
                   members: tuple[int, ...]) -> list[DeviceBuffer | None]:
        cuda = self._cuda
        assert cuda is not None
        counts = [math.prod(shape) for shape in response.shapes]
        itemsize = DTYPE_SIZES[response.dtype]
        args = (response.dtype, counts, response.reduce_op, response.prescale, response.postscale)
        first = entries[0]
        if len(entries) == 1 and first is not None:
            out = first.output
            assert isinstance(out, DeviceBuffer) and isinstance(first.tensor, DeviceBuffer)
            transport.allreduce(members, first.tensor.ptr, out.ptr, *args)
            return [out]
        fused = self._scratch(sum(counts) * itemsize)
        at = fused
        for entry, count in zip(entries, counts):
            if entry is None:  # a joined rank contributes zeros
                cuda.zero(at, count * itemsize, transport.stream)
            else:
                cuda.copy(at, entry.tensor.ptr, count * itemsize, transport.stream)  # type: ignore[union-attr]
            at += count * itemsize
        transport.allreduce(members, fused, fused, *args)
        at = fused
        outputs: list[DeviceBuffer | None] = []
        for entry, count in zip(entries, counts):
            if entry is not None:
                out = entry.output
                assert isinstance(out, DeviceBuffer)
                cuda.copy(out.ptr, at, count * itemsize, transport.stream)
                outputs.append(out)
            else:
                outputs.append(None)
            at += count * itemsize
        return outputs

    def _allgather(self, transport: DeviceTransport, response: Response, entry: Entry | None,
                   members: tuple[int, ...]) -> DeviceBuffer:
        assert entry is not None and isinstance(entry.tensor, DeviceBuffer)
        trailing = tuple(response.shapes[0][1:])
        row = math.prod(trailing)
        first_dims = response.first_dims[0]
        out = entry.tensor.allocate((sum(first_dims),) + trailing)
        transport.allgatherv(members, entry.tensor.ptr, out.ptr, response.dtype, [d * row for d in first_dims])
        return out

    def _broadcast(self, transport: DeviceTransport, response: Response, entry: Entry | None,
                   members: tuple[int, ...]) -> DeviceBuffer:
        assert entry is not None and isinstance(entry.tensor, DeviceBuffer) and isinstance(entry.output, DeviceBuffer)
        out = entry.output
        if self._host.rank == response.root_rank and out is not entry.tensor:
            self._cuda.copy(out.ptr, entry.tensor.ptr, out.nbytes, transport.stream)  # type: ignore[union-attr]
        transport.broadcast(members, out.ptr, response.dtype, out.size, response.root_rank)
        return out

    def _alltoall(self, transport: DeviceTransport, response: Response, entry: Entry | None,
                  members: tuple[int, ...]) -> tuple[DeviceBuffer, np.ndarray]:
        assert entry is not None and isinstance(entry.tensor, DeviceBuffer)
        me = members.index(self._host.rank)
        trailing = tuple(entry.tensor.shape[1:])
        row = math.prod(trailing)
        send_rows = response.splits[me]
        recv_rows = [response.splits[src][me] for src in range(len(members))]
        out = entry.tensor.allocate((sum(recv_rows),) + trailing)
        transport.alltoallv(members, entry.tensor.ptr, [r * row for r in send_rows], out.ptr,
                            [r * row for r in recv_rows], response.dtype)
        return out, np.asarray(recv_rows, np.int32)

    def _reducescatter(self, transport: DeviceTransport, response: Response, entry: Entry | None,
                       members: tuple[int, ...]) -> DeviceBuffer:
        assert entry is not None and isinstance(entry.tensor, DeviceBuffer) and isinstance(entry.output, DeviceBuffer)
        n = len(members)
        shape = response.shapes[0]
        row = math.prod(shape[1:])
        counts = [(shape[0] // n + (i < shape[0] % n)) * row for i in range(n)]
        transport.reducescatter(members, entry.tensor.ptr, entry.output.ptr, response.dtype, counts,
                                response.reduce_op, response.prescale, response.postscale)
        return entry.output

    # -- ending ----------------------------------------------------------------------------
    def abort(self) -> None:
        """A peer failed: stop device work that waits for it (from any thread)."""
        if self._nccl is not None:
            self._nccl.abort()

    def close(self) -> None:
        for transport in (self._nccl, self._staged):
            if transport is not None:
                transport.close()
        self._nccl = self._staged = None
        if self._fusion and self._cuda is not None:
            self._cuda.free(self._fusion)
            self._fusion = 0
