"""The NCCL device transport: one communicator per group of ranks, built when first needed.

A communicator forms the first time a group (a process set's members) runs a device collective
that NCCL takes. All members do so at the same point of the same response, so forming it is
itself collective: the group's first member makes NCCL's unique id and sends it to the others
over the host transport (our authenticated connections, or MPI's in a job mpirun started).
Whether the group may use NCCL at all was agreed before (`DeviceExecutor`).

Communicators are non-blocking: a peer that never arrives, or dies mid-collective, cannot hold
this thread inside NCCL. When the engine learns that a peer failed it aborts every communicator
(`abort`), which also ends kernels that wait for the dead peer. They belong to one round of the
job: `init()` after a failure (elastic training) builds new ones.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

from horovod.common.device.cuda_runtime import CudaRuntime
from horovod.common.engine.messages import OpType, Response
from horovod.common.logging import log
from horovod.common.partition import offsets
from horovod.common.reduce_ops import DTYPE_SIZES
from horovod.common.settings import Settings
from horovod.common.transport.base import Transport
from horovod.common.transport.device import DeviceTransport
from horovod.common.transport.nccl import reductions
from horovod.common.transport.nccl.library import DATA_TYPES, IN_PROGRESS, Nccl

_POLL_SECONDS = 1e-4


def share_unique_id(host: Transport, group: Sequence[int], make: Callable[[], bytes]) -> bytes:
    """The group's first member makes NCCL's unique id (`make`); every member gets it, over the
    host transport's authenticated connections."""
    root = group[0]
    return host.bcast_bytes(group, make() if host.rank == root else None, root)


class NcclTransport(DeviceTransport):
    name = "nccl"

    def __init__(self, host: Transport, settings: Settings, cuda: CudaRuntime, nccl: Nccl, device: int) -> None:
        self._host = host
        self._settings = settings
        self._cuda = cuda
        self._nccl = nccl
        self.device = device
        self.rank = host.rank
        self.stream = cuda.create_stream()
        self._comms: dict[tuple[int, ...], int] = {}

    @property
    def version(self) -> int:
        return self._nccl.version

    # -- forming communicators -------------------------------------------------------------
    def unsupported(self, response: Response, group: Sequence[int]) -> str:
        key = tuple(group)
        if key not in self._comms:
            self._form(key)
        if response.op_type in (OpType.ALLREDUCE, OpType.REDUCESCATTER):
            plan = reductions.plan(response.dtype, response.reduce_op, response.prescale, response.postscale,
                                   len(group))
            return plan if isinstance(plan, str) else ""
        return "" if response.dtype in DATA_TYPES else f"NCCL has no {response.dtype} type"

    def _form(self, group: tuple[int, ...]) -> None:
        """Build the group's communicator (every member calls this at the same response)."""
        unique_id = share_unique_id(self._host, group, self._nccl.unique_id)
        comm, code = self._nccl.init_rank(len(group), unique_id, group.index(self.rank))
        self._comms[group] = comm
        self._settle(comm, code, f"forming the NCCL communicator of ranks {list(group)}",
                     self._settings.start_timeout)
        log.debug("rank %d: NCCL %d communicator of ranks %s on device %d", self.rank, self._nccl.version,
                  list(group), self.device)

    def _settle(self, comm: int, code: int, what: str, timeout: float | None = None) -> None:
        """Wait while a non-blocking call is still in progress (connection set-up, mostly)."""
        if code != IN_PROGRESS:
            return
        seconds = timeout or self._settings.peer_timeout_seconds
        limit_name = "HOROVOD_START_TIMEOUT" if timeout else "HOROVOD_GLOO_TIMEOUT_SECONDS"
        limit = time.monotonic() + seconds
        while self._nccl.async_error(comm) == IN_PROGRESS:
            if time.monotonic() > limit:
                raise TimeoutError(f"{what}: NCCL did not finish within {seconds:.0f} s ({limit_name}); a peer may have failed")
            time.sleep(_POLL_SECONDS)

    # -- collectives -----------------------------------------------------------------------
    def _reduction(self, dtype: str, op: int, prescale: float, postscale: float, comm: int,
                   group: Sequence[int]) -> tuple[int, int, bool]:
        """(nccl dtype, nccl op, whether the op is ours to destroy after the call)."""
        plan = reductions.plan(dtype, op, prescale, postscale, len(group))
        assert not isinstance(plan, str), plan  # `unsupported` kept such responses away
        if plan.premul:
            return plan.nccl_dtype, self._nccl.premul_sum(reductions.scalar_bytes(dtype, plan.factor),
                                                          plan.nccl_dtype, comm), True
        return plan.nccl_dtype, plan.op, False

    def allreduce(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int], op: int,
                  prescale: float, postscale: float) -> None:
        comm = self._comms[tuple(group)]
        nccl_dtype, nccl_op, owned = self._reduction(dtype, op, prescale, postscale, comm, group)
        code = self._nccl.all_reduce(send, recv, sum(counts), nccl_dtype, nccl_op, comm, self.stream)
        self._settle(comm, code, "ncclAllReduce")
        if owned:
            self._nccl.destroy_op(nccl_op, comm)

    def allgatherv(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int]) -> None:
        comm, nccl_dtype, itemsize = self._comms[tuple(group)], DATA_TYPES[dtype], DTYPE_SIZES[dtype]
        if len(set(counts)) == 1:
            self._settle(comm, self._nccl.all_gather(send, recv, counts[0], nccl_dtype, comm, self.stream),
                         "ncclAllGather")
            return
        # Uneven parts: each member broadcasts its own, all in one group call.
        self._nccl.group_start()
        for i, (start, count) in enumerate(zip(offsets(counts), counts)):
            if count:
                self._nccl.broadcast(send, recv + start * itemsize, count, nccl_dtype, i, comm, self.stream)
        self._settle(comm, self._nccl.group_end(comm), "ncclAllGather (uneven, as broadcasts)")

    def broadcast(self, group: Sequence[int], buf: int, dtype: str, count: int, root: int) -> None:
        comm = self._comms[tuple(group)]
        code = self._nccl.broadcast(buf, buf, count, DATA_TYPES[dtype], list(group).index(root), comm, self.stream)
        self._settle(comm, code, "ncclBroadcast")

    def alltoallv(self, group: Sequence[int], send: int, send_counts: Sequence[int], recv: int,
                  recv_counts: Sequence[int], dtype: str) -> None:
        comm, nccl_dtype, itemsize = self._comms[tuple(group)], DATA_TYPES[dtype], DTYPE_SIZES[dtype]
        self._nccl.group_start()
        for peer, (out_at, out, in_at, into) in enumerate(zip(offsets(send_counts), send_counts,
                                                              offsets(recv_counts), recv_counts)):
            if out:
                self._nccl.send(send + out_at * itemsize, out, nccl_dtype, peer, comm, self.stream)
            if into:
                self._nccl.recv(recv + in_at * itemsize, into, nccl_dtype, peer, comm, self.stream)
        self._settle(comm, self._nccl.group_end(comm), "alltoall (ncclSend/ncclRecv)")

    def reducescatter(self, group: Sequence[int], send: int, recv: int, dtype: str, counts: Sequence[int], op: int,
                      prescale: float, postscale: float) -> None:
        comm, itemsize = self._comms[tuple(group)], DTYPE_SIZES[dtype]
        nccl_dtype, nccl_op, owned = self._reduction(dtype, op, prescale, postscale, comm, group)
        if len(set(counts)) == 1:
            code = self._nccl.reduce_scatter(send, recv, counts[0], nccl_dtype, nccl_op, comm, self.stream)
        else:  # uneven blocks (dim 0 does not divide by the group): one reduce to each block's owner
            self._nccl.group_start()
            for i, (start, count) in enumerate(zip(offsets(counts), counts)):
                if count:
                    self._nccl.reduce(send + start * itemsize, recv, count, nccl_dtype, nccl_op, i, comm, self.stream)
            code = self._nccl.group_end(comm)
        self._settle(comm, code, "ncclReduceScatter")
        if owned:
            self._nccl.destroy_op(nccl_op, comm)

    # -- ending ----------------------------------------------------------------------------
    def abort(self) -> None:
        comms, self._comms = self._comms, {}
        for comm in comms.values():
            self._nccl.abort(comm)

    def close(self) -> None:
        if self._comms:
            try:
                self._cuda.synchronize(self.stream)  # the last results land before their memory may go
            except RuntimeError as exc:
                log.warning("rank %d: the NCCL stream failed at shutdown: %s", self.rank, exc)
                self.abort()
        comms, self._comms = self._comms, {}
        for comm in comms.values():
            self._nccl.destroy(comm)
        if self.stream:
            self._cuda.destroy_stream(self.stream)
            self.stream = 0
