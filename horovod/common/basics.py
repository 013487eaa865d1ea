"""The process-wide runtime: `init()` builds it, `shutdown()` tears it down, queries read it.

This is the only global state of the library. `init()` after `shutdown()` builds a new runtime
(a new transport generation), which is what elastic training needs to re-form the ring.
"""

from __future__ import annotations

import atexit
import importlib.util
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Sequence

from horovod.common import logging as hvd_logging
from horovod.common.engine.engine import Engine
from horovod.common.engine.handles import Entry, Handle
from horovod.common.engine.messages import OpType, Request
from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.rendezvous import JOINED, RendezvousClient
from horovod.common.settings import Settings
from horovod.common.transport import TransportContext, create as create_transport
from horovod.common.transport.base import PeerFailure, Transport

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclass
class Runtime:
    settings: Settings
    transport: Transport
    engine: Engine
    rendezvous: RendezvousClient | None
    timeline: Any
    process_sets: dict[int, ProcessSet] = field(default_factory=dict)
    name_counters: dict[int, int] = field(default_factory=dict)

    def next_anonymous_id(self, process_set: ProcessSet) -> int:
        """Unnamed ops are numbered per process set: members submit the same sequence of ops in
        a set, whatever else they do, so their generated names agree."""
        key = process_set.process_set_id if process_set.process_set_id is not None else -1
        self.name_counters[key] = self.name_counters.get(key, 0) + 1
        return self.name_counters[key]

    def submit(self, process_set: ProcessSet, entries: list[Entry]) -> None:
        process_set._require_registered()
        if self.settings.topology.rank not in process_set.ranks:
            raise ValueError(
                f"rank {self.settings.topology.rank} is not a member of {process_set}; only its members "
                "may submit collectives on it"
            )
        self.engine.enqueue(process_set.process_set_id, entries)

    def _set_change(self, op_type: OpType, name: str, shape: tuple[int, ...], root: int) -> Any:
        handle = Handle(1, False, name)
        request = Request(self.settings.topology.rank, op_type, name, shape=shape, root_rank=root)
        self.engine.enqueue(0, [Entry(request, None, None, handle)])
        return handle.wait()

    def add_process_set(self, process_set: ProcessSet | Sequence[int]) -> ProcessSet:
        if not self.settings.dynamic_process_sets:
            raise ValueError("adding process sets after init needs HOROVOD_DYNAMIC_PROCESS_SETS=1 "
                             "(or hvd.init(process_sets='dynamic'))")
        ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
        if ps.mpi_comm is not None:
            raise NotImplementedError("process sets from MPI communicators need the MPI controller")
        size = self.settings.topology.size
        if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= size:
            raise ValueError(f"process set ranks {ps.ranks} must be within 0..{size - 1}")
        for existing in self.process_sets.values():
            if existing.ranks == ps.ranks:
                raise ValueError(f"a process set with ranks {ps.ranks} already exists "
                                 f"(id {existing.process_set_id})")
        set_id = self._set_change(OpType.ADD_PROCESS_SET, f"process_set.add.{ps.ranks}", tuple(ps.ranks), -1)
        ps.process_set_id = set_id
        self.process_sets[set_id] = ps
        self.name_counters.pop(set_id, None)  # ids are reused: a new set starts numbering afresh
        return ps

    def remove_process_set(self, ps: ProcessSet) -> bool:
        if not self.settings.dynamic_process_sets:
            raise ValueError("removing process sets needs HOROVOD_DYNAMIC_PROCESS_SETS=1")
        if ps.process_set_id in (None, 0) or ps.process_set_id not in self.process_sets:
            return False
        set_id = ps.process_set_id
        removed = self._set_change(OpType.REMOVE_PROCESS_SET, f"process_set.remove.{set_id}", (), set_id)
        del self.process_sets[set_id]
        ps.process_set_id = None
        return bool(removed)


_runtime: Runtime | None = None
_lock = threading.RLock()
_generation = 0
_atexit_registered = False
_failure_reported = False
_exiting_with_error = False  # set by the excepthook: shutdown() then leaves without waiting


def runtime() -> Runtime:
    rt = _runtime
    if rt is None:
        raise ValueError(NOT_INITIALIZED)
    return rt


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Join the job. Idempotent while running; works again after `shutdown()`."""
    global _runtime, _generation, _atexit_registered
    with _lock:
        if _runtime is not None:
            return
        if comm is not None and not (isinstance(comm, (list, tuple)) and list(comm) == list(
                range(Settings.from_env().topology.size))):
            raise NotImplementedError(
                "init(comm=...) with an MPI communicator or a subset of ranks needs the MPI controller, "
                "which khorovod does not have yet; use process_sets= for collectives over subsets")
        import os

        if process_sets == "dynamic":
            os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
            process_sets = None
        settings = Settings.from_env()
        hvd_logging.configure(settings.log_level, settings.log_hide_time)
        topo = settings.topology
        _generation += 1
        rendezvous = None
        if topo.size > 1:
            if settings.rendezvous_addr is None or settings.rendezvous_port is None or not settings.secret_key:
                raise ValueError(
                    f"HOROVOD_SIZE={topo.size} but no rendezvous store is configured; start the job "
                    "with horovodrun (or horovod.run), which sets HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT")
            rendezvous = RendezvousClient(settings.rendezvous_addr, settings.rendezvous_port,
                                          settings.secret_key, settings.start_timeout,
                                          settings.failure_detection_seconds)
        transport = None
        try:
            if rendezvous is not None:
                rendezvous.put(JOINED, str(topo.rank), b"")  # the launcher times the start from here
            transport = create_transport(settings.cpu_operations,
                                         TransportContext(topo, settings, rendezvous, _generation))
            sets = _static_sets(process_sets, topo.size)
            _check_sets_agree(transport, sets)
        except BaseException as exc:
            # Nothing of a failed init may linger: no connection, no thread, no shared memory.
            if transport is not None:
                transport.close()
            if rendezvous is not None:
                rendezvous.close()
            if isinstance(exc, (PeerFailure, TimeoutError)):
                raise HorovodInternalError(f"hvd.init() failed on rank {topo.rank}: {exc}") from None
            raise
        timeline = None
        if topo.rank == 0:
            from horovod.common.timeline import Timeline

            timeline = Timeline()
            if settings.timeline and settings.timeline.upper() != "DYNAMIC":
                timeline.start(settings.timeline, settings.timeline_mark_cycles)
        global_process_set.ranks = list(range(topo.size))
        engine = Engine(settings, transport, {ps.process_set_id: tuple(ps.ranks) for ps in sets}, timeline)
        _runtime = Runtime(settings, transport, engine, rendezvous, timeline,
                           {ps.process_set_id: ps for ps in sets})
        engine.start()
        _install_failure_reporter()
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def _static_sets(process_sets: Sequence[ProcessSet] | None, size: int) -> list[ProcessSet]:
    sets = [global_process_set]
    seen = {tuple(range(size))}
    for ps in process_sets or []:
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"process_sets must be ProcessSet objects, got {ps!r}")
        if ps.mpi_comm is not None:
            raise NotImplementedError("process sets from MPI communicators need the MPI controller")
        if tuple(ps.ranks) in seen:
            raise ValueError(f"process set {ps.ranks} is given twice (or equals the global set)")
        if not ps.ranks or ps.ranks[0] < 0 or ps.ranks[-1] >= size:
            raise ValueError(f"process set ranks {ps.ranks} must be within 0..{size - 1}")
        seen.add(tuple(ps.ranks))
        ps.process_set_id = len(sets)
        sets.append(ps)
    return sets


def _check_sets_agree(transport: Transport, sets: list[ProcessSet]) -> None:
    """Static sets must be identical everywhere; say which ranks differ instead of hanging later."""
    from horovod.common import wire

    mine = [tuple(ps.ranks) for ps in sets[1:]]
    everyone = [wire.decode(p) for p in transport.exchange(list(range(transport.size)), wire.encode(mine))]
    if any(theirs != mine for theirs in everyone):
        detail = "; ".join(f"rank {r}: {sets_}" for r, sets_ in enumerate(everyone))
        raise ValueError(f"Different ranks tried to set up mismatching process sets at init ({detail}). "
                         "Pass the same process_sets= on every rank.")


def shutdown() -> None:
    """Leave the job: stops this rank's engine and, after the current cycle, every other rank's."""
    global _runtime
    with _lock:
        rt = _runtime
        if rt is None:
            return
        _runtime = None
        rt.engine.request_shutdown(wait_for_peers=not _exiting_with_error)
        if rt.timeline is not None:
            rt.timeline.stop()
        if rt.rendezvous is not None:
            rt.rendezvous.close()
        for ps in rt.process_sets.values():
            if ps is not global_process_set:
                ps.process_set_id = None


def _install_failure_reporter() -> None:
    """Record this rank's first uncaught exception where horovodrun can show it as the root cause."""
    previous = sys.excepthook
    if getattr(previous, "_horovod_reporter", False):
        return

    def report(exc_type: type, exc: BaseException, tb: Any) -> None:
        global _exiting_with_error
        _exiting_with_error = True
        report_failure("".join(traceback.format_exception(exc_type, exc, tb)))
        previous(exc_type, exc, tb)

    report._horovod_reporter = True  # type: ignore[attr-defined]
    sys.excepthook = report


def report_failure(text: str) -> None:
    """Write `failures/<rank>` in the rendezvous store once per process (best effort)."""
    global _failure_reported
    rt = _runtime
    if _failure_reported or rt is None or rt.rendezvous is None:
        return
    _failure_reported = True
    try:
        rt.rendezvous.put("failures", str(rt.settings.topology.rank), text.encode("utf-8", "replace"))
    except OSError:
        pass


def is_initialized() -> bool:
    return _runtime is not None


def _topology() -> Any:
    return runtime().settings.topology


def size() -> int:
    return _topology().size


def rank() -> int:
    return _topology().rank


def local_size() -> int:
    return _topology().local_size


def local_rank() -> int:
    return _topology().local_rank


def cross_size() -> int:
    return _topology().cross_size


def cross_rank() -> int:
    return _topology().cross_rank


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks (size is a multiple of local_size
    and every local rank appears on every host)."""
    topo = _topology()
    return topo.size == topo.local_size * topo.cross_size


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start writing a timeline (rank 0 writes; other ranks do nothing)."""
    rt = runtime()
    if rt.timeline is not None:
        rt.timeline.start(file_path, mark_cycles)


def stop_timeline() -> None:
    rt = runtime()
    if rt.timeline is not None:
        rt.timeline.stop()


# Build queries, with Horovod's names and types. Our TCP transport plays Gloo's role.
def gloo_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return importlib.util.find_spec("mpi4py") is not None


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    if not mpi_enabled():
        raise ValueError("MPI is not enabled: khorovod runs on its own TCP transport (Gloo's role)")
    return True


def nccl_built() -> int:
    return 0


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False
