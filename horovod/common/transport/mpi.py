"""The MPI transport (`HOROVOD_CPU_OPERATIONS=mpi`): collectives and control messages over mpi4py.

Data collectives go straight to the MPI library on the caller's numpy buffers, with no copy of
ours: in-place `Allreduce`, `Allgatherv`, `Bcast`, `Alltoallv`, `Reduce_scatter`, each on the
communicator of the op's group (built once per group with `Create_group`, which only the group's
members call, so process sets need no agreement beyond the op itself). Reductions MPI has no
operator for (bfloat16; float16, which Open MPI 5 sums more slowly than this at 2 ranks) gather
every member's buffer and reduce it here, in member order, so every member gets the same bits.
Average never reaches a transport: the engine sums, then scales. Adasum is the shared algorithm
(`algorithms.adasum`, recursive halving) over MPI's point-to-point messages (`MpiLinks`).

Negotiation keeps the engine's protocol: its control messages are point-to-point messages on a
communicator of their own (MPI keeps them in order between two ranks, as a socket does). MPI
gives no file descriptor to sleep on, so a doorbell thread probes for an incoming control message
while a sleeper listens, backing off from 50 us to 2 ms, and rings that sleeper's pipe; an idle
job costs one probe every 2 ms. A peer silent past `HOROVOD_GLOO_TIMEOUT_SECONDS` inside a
negotiation is reported as hung; a peer that dies is mpirun's to report, which ends the job.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

import numpy as np

from horovod.common import mpi_library
from horovod.common.algorithms import Scratch, adasum
from horovod.common.cores import cores_per_rank
from horovod.common.reduce_ops import Max, Min, Product, Sum, reduce_into
from horovod.common.transport.activity import PeerActivity
from horovod.common.transport.base import PeerFailure, Transport, TransportContext

_CONTROL_TAG = 7
_DATA_TAG = 8  # point-to-point data on the data communicator (Adasum's halves); collectives never match it
_POLL_MIN, _POLL_MAX = 50e-6, 2e-3
_SPIN_SECONDS = 0.01


class MpiActivity(PeerActivity):
    """A peer talks when its control message waits on our control communicator. MPI gives no fd
    to sleep on, so a doorbell thread probes while a sleeper listens and rings that sleeper's pipe.

    Each sleeper is rung at most once per time it listens: `_unrung` holds the sleepers that
    listen and have not been rung yet, so one that starts listening while the other was just rung
    is still served. While a framework thread drives the engine, the idle engine thread's sleep is
    `muted`: the driver answers peers itself, and probing for (then waking) a thread that has
    nothing to do would take a core from the ranks doing the work."""

    def __init__(self, control: Any, any_source: int) -> None:
        self._control = control  # the communicator control messages arrive on
        self._any_source = any_source
        self._pipes = {driver: os.pipe() for driver in (False, True)}
        for read_end, _ in self._pipes.values():
            os.set_blocking(read_end, False)
        self._unrung: set[bool] = set()
        self._muted = False
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hvd-mpi-doorbell", daemon=True)
        self._thread.start()

    def pending(self) -> bool:
        # Positional arguments: mpi4py parses keywords slowly.
        return bool(self._control.Iprobe(self._any_source, _CONTROL_TAG))

    def fds(self, driver: bool) -> dict[int, bool]:
        return {self._pipes[driver][0]: False}

    def listen(self, driver: bool, on: bool) -> None:
        with self._changed:
            (self._unrung.add if on else self._unrung.discard)(driver)
            self._changed.notify()

    def set_caller_driving(self, on: bool) -> None:
        """Mutes the idle engine thread's doorbell (on) or unmutes it (off).

        Wakes nobody, and takes no lock (a driver calls this twice per op; storing a bool is
        atomic). Muting: the thread finds out on its next probe. Unmuting: a driver unmutes
        after each op and mutes again at its next, and waking this thread each time cost a
        back-to-back op about half its time at 2 ranks (the thread takes the GIL and a core). A
        muted thread looks again every _POLL_MAX instead (see `_run`): the engine thread is rung
        at most that much later, the longest a probe's pause is anyway."""
        self._muted = on

    def _listeners(self) -> set[bool]:
        return self._unrung - {False} if self._muted else self._unrung

    def drain(self, driver: bool) -> None:
        try:
            while os.read(self._pipes[driver][0], 64):
                pass
        except BlockingIOError:
            pass

    def _run(self) -> None:
        pause = _POLL_MIN
        while True:
            with self._changed:
                while not self._listeners() and not self._closed:
                    # Muted while the engine thread listens: unmuting does not notify (see
                    # set_caller_driving).
                    self._changed.wait(_POLL_MAX if self._muted and False in self._unrung else None)
                    pause = _POLL_MIN
                if self._closed:
                    return
                listeners = self._listeners()
            if self.pending():
                with self._changed:
                    for driver in listeners & self._listeners():
                        os.write(self._pipes[driver][1], b"!")
                        self._unrung.discard(driver)
                continue
            time.sleep(pause)
            pause = min(pause * 2, _POLL_MAX)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join()
        for read_end, write_end in self._pipes.values():
            os.close(read_end)
            os.close(write_end)


class MpiLinks:
    """`PointToPoint` over MPI messages between global ranks: sends are `Isend`s that `flush` waits
    for, receives are blocking `Recv`s straight into the caller's memory (MPI keeps the messages
    between two ranks with one tag in order, as a socket keeps bytes)."""

    def __init__(self, rank: int, comm: Any, mpi: Any) -> None:
        self.rank = rank
        self._comm = comm
        self._MPI = mpi
        self._sending: dict[int, list[Any]] = {}

    def send(self, rank: int, data: np.ndarray) -> None:
        self._sending.setdefault(rank, []).append(self._comm.Isend(_bytes(data), rank, _DATA_TAG))

    def recv_into(self, rank: int, view: np.ndarray) -> None:
        self._comm.Recv(_bytes(view), rank, _DATA_TAG)

    def flush(self, ranks: Sequence[int]) -> None:
        for rank in ranks:
            self._MPI.Request.Waitall(self._sending.pop(rank, []))


class MpiTransport(Transport):
    """Collectives through the MPI library, negotiation over MPI point-to-point messages."""

    name = "mpi"
    # MPI's allreduce of a small buffer is one call into C, faster than the larger messages
    # (measured: 4 KiB took 31-86 us carried, against 25 us through MPI_Allreduce).
    eager_bytes = 0

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        if context.communicator is None and context.settings.bootstrap != "mpi" and context.size > 1:
            # Say so before loading MPI: a singleton MPI started here only to refuse would leave its
            # shared-memory segments behind in /dev/shm.
            raise ValueError(
                f"HOROVOD_CPU_OPERATIONS=mpi needs a job that MPI started (mpirun, or horovodrun --mpi): "
                f"this is rank {context.rank} of {context.size}, started by the "
                f"{context.settings.bootstrap!r} bootstrap, not by MPI")
        slot = context.settings.launcher_slot
        if not mpi_library.available() and slot is not None:
            raise ImportError(
                f"rank {context.rank} of {context.size}: {slot.launcher} started this job, whose ranks meet "
                f"through MPI, but mpi4py is not installed here; {mpi_library.INSTALL_HINT}, or start the "
                "job with horovodrun")
        MPI = mpi_library.load()
        mpi_library.require_threads()
        job = context.communicator if context.communicator is not None else MPI.COMM_WORLD
        if job.size != context.size or job.rank != context.rank:
            raise ValueError(
                f"HOROVOD_CPU_OPERATIONS=mpi needs a job that MPI started (mpirun, or horovodrun --mpi): "
                f"this is rank {context.rank} of {context.size}, but MPI sees rank {job.rank} of {job.size}")
        self._MPI = MPI
        self._timeout = context.settings.peer_timeout_seconds
        self._oversubscribed = cores_per_rank(context.topology.local_size) < 1.0
        self._data = job.Dup()
        self._control = job.Dup()
        self._groups: dict[tuple[int, ...], Any] = {tuple(range(self.size)): self._data}
        self._ops: dict[tuple[np.dtype, int], Any] = {}  # MPI's operator per (dtype, op), see _op
        self._peers: dict[tuple[int, ...], list[int]] = {}  # a group's members other than us, see exchange
        self._status = MPI.Status()  # a probed message's envelope, see _recv
        self._links = MpiLinks(self.rank, self._data, MPI)
        self._scratch = Scratch()
        self._activity = MpiActivity(self._control, MPI.ANY_SOURCE)
        self._closed = False

    def _comm(self, group: Sequence[int]) -> Any:
        """The communicator of `group`; built by its members the first time they use it."""
        key = tuple(group)
        comm = self._groups.get(key)
        if comm is None:
            comm = self._data.Create_group(self._data.group.Incl(list(key)))
            self._groups[key] = comm
        return comm

    def _op(self, dtype: np.dtype, op: int) -> Any:
        """MPI's operator for `op` on `dtype`; None when MPI cannot reduce that type. Looked up
        once per pair: every allreduce asks."""
        key = (dtype, op)
        if key not in self._ops:
            self._ops[key] = self._find_op(dtype, op)
        return self._ops[key]

    def _find_op(self, dtype: np.dtype, op: int) -> Any:
        MPI = self._MPI
        if dtype == np.bool_:
            return MPI.LOR if op in (Sum, Max) else MPI.LAND
        if dtype.char == "e":  # older libraries cannot sum float16; Open MPI 5 does it slowly
            return None
        try:
            MPI.Datatype.fromcode(dtype.char)
        except ValueError:  # bfloat16
            return None
        return {Sum: MPI.SUM, Min: MPI.MIN, Max: MPI.MAX, Product: MPI.PROD}.get(op)

    # -- data plane -------------------------------------------------------------------------
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        comm = self._comm(group)
        mpi_op = self._op(buf.dtype, op)
        if mpi_op is not None:
            comm.Allreduce(self._MPI.IN_PLACE, buf, mpi_op)  # positional: mpi4py parses keywords slowly
            return
        everyone = self._gather_all(comm, buf)
        self._reduce_rows(everyone, buf, op)

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray,
                      counts: Sequence[int], op: int) -> None:
        comm = self._comm(group)
        mpi_op = self._op(buf.dtype, op)
        if mpi_op is not None:
            comm.Reduce_scatter(buf, recv, list(counts), op=mpi_op)
            return
        self.allreduce(group, buf, op)
        start = sum(counts[: comm.rank])
        recv[:] = buf[start:start + counts[comm.rank]]

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray,
                   counts: Sequence[int]) -> None:
        size = recv.dtype.itemsize
        self._comm(group).Allgatherv(_bytes(send), _bytes(recv, [c * size for c in counts]))

    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        self._comm(group).Bcast(_bytes(buf), root=list(group).index(root))

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int],
                  recv: np.ndarray, recv_counts: Sequence[int]) -> None:
        size = send.dtype.itemsize
        self._comm(group).Alltoallv(_bytes(send, [c * size for c in send_counts]),
                                    _bytes(recv, [c * size for c in recv_counts]))

    def adasum(self, group: Sequence[int], buf: np.ndarray, bounds: Sequence[tuple[int, int]]) -> None:
        adasum.allreduce(self._links, group, buf, bounds, self._scratch)

    def _gather_all(self, comm: Any, buf: np.ndarray) -> np.ndarray:
        everyone = np.empty((comm.size, buf.size), dtype=buf.dtype)
        comm.Allgather(_bytes(buf), _bytes(everyone.reshape(-1)))
        return everyone

    @staticmethod
    def _reduce_rows(rows: np.ndarray, out: np.ndarray, op: int) -> None:
        out[:] = rows[0]
        for row in rows[1:]:
            reduce_into(out, row, op)

    # -- control plane ----------------------------------------------------------------------
    def _send_all(self, ranks: Sequence[int], payload: bytes) -> list[Any]:
        control, byte = self._control, self._MPI.BYTE  # positional arguments: mpi4py parses keywords slowly
        return [control.Isend([payload, byte], r, _CONTROL_TAG) for r in ranks]

    def _recv(self, rank: int) -> bytes:
        """The next control message from `rank`; PeerFailure when it stays silent too long."""
        status = self._status  # one thread at a time negotiates: the one driving the engine
        if not self._control.Iprobe(rank, _CONTROL_TAG, status):
            self._await(rank, status)
        byte = self._MPI.BYTE
        data = bytearray(status.Get_count(byte))
        self._control.Recv([data, byte], rank, _CONTROL_TAG)
        return bytes(data)

    def _await(self, rank: int, status: Any) -> None:
        """Probe until a control message from `rank` is there (its envelope lands in `status`).

        Spin first, as MPI itself waits: a sleep's wake-up costs more than a small op. A rank with
        a core of its own spins on the probe alone (yielding the core each time cost 0.8 us of a
        2 us exchange at 2 ranks); an oversubscribed one yields, so the ranks sharing its core
        keep moving. After _SPIN_SECONDS, sleep with back-off, up to the peer timeout."""
        start = time.monotonic()
        pause = 0.0
        while not self._control.Iprobe(rank, _CONTROL_TAG, status):
            waited = time.monotonic() - start
            if waited > self._timeout:
                raise PeerFailure(rank, f"sent nothing for {self._timeout:g} s during negotiation "
                                        "(HOROVOD_GLOO_TIMEOUT_SECONDS); it looks hung")
            if waited < _SPIN_SECONDS:
                if self._oversubscribed:
                    os.sched_yield()
            else:
                time.sleep(pause)
                pause = min(pause * 2 or _POLL_MIN, _POLL_MAX)

    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        key = tuple(group)
        peers = self._peers.get(key)
        if peers is None:
            peers = self._peers[key] = [r for r in group if r != self.rank]
        pending = self._send_all(peers, payload)
        result = [payload if r == self.rank else self._recv(r) for r in group]
        self._MPI.Request.Waitall(pending)
        return result

    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        if self.rank != root:
            self._MPI.Request.Waitall(self._send_all([root], payload))
            return None
        return [payload if r == root else self._recv(r) for r in group]

    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        if self.rank != root:
            return self._recv(root)
        assert payload is not None
        self._MPI.Request.Waitall(self._send_all([r for r in group if r != root], payload))
        return payload

    @property
    def activity(self) -> MpiActivity:
        return self._activity

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._activity.close()
        for comm in {id(c): c for c in (*self._groups.values(), self._control)}.values():
            comm.Free()


def _bytes(array: np.ndarray, counts: list[int] | None = None) -> list[Any]:
    """The array's memory as an MPI byte buffer (blocks of `counts` bytes): moving data needs no MPI
    type for its dtype (bfloat16), and no copy."""
    data = array.reshape(-1).view(np.uint8)
    byte = mpi_library.load().BYTE
    return [data, byte] if counts is None else [data, counts, byte]
