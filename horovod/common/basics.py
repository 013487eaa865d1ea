"""Horovod's lifecycle and queries: `init()` joins a round of the job, `shutdown()` leaves it.

`init()` asks the bootstrap (`horovod.common.bootstrap`) who this process is, connects the
transport for that round and starts the engine; the result is the one process-wide runtime
(`horovod.common.runtime`). `init()` after `shutdown()` joins a new round, possibly with another
membership, which is what elastic training needs to re-form the ring.
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
import traceback
from typing import Any, Sequence

from horovod.common import bootstrap
from horovod.common import logging as hvd_logging
from horovod.common import mpi_library
from horovod.common import runtime as _state
from horovod.common.engine.engine import Engine
from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import ProcessSet, check_static_sets_agree, global_process_set, register_static
from horovod.common.runtime import Runtime
from horovod.common.settings import Settings, Topology
from horovod.common.transport import create as create_transport
from horovod.common.transport.base import PeerFailure, Transport, TransportContext

_atexit_registered = False
_failure_reported = False
_exiting_with_error = False  # set by the excepthook: shutdown() then leaves without waiting


# The runtime of the current round; ValueError when `init()` has not run. The function itself,
# not a wrapper: every collective asks, twice.
runtime = _state.current


def init(comm: Any = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Join the job. Idempotent while running; works again after `shutdown()`."""
    global _atexit_registered
    with _state.lock:
        if _state.peek() is not None:
            return
        settings = Settings.from_env()
        if process_sets == "dynamic":
            settings = dataclasses.replace(settings, dynamic_process_sets=True)
            process_sets = None
        hvd_logging.configure(settings.log_level, settings.log_hide_time)
        try:
            settings, membership, transport, sets = _join(settings, comm, process_sets)
        except BaseException:
            mpi_library.abort_job_if_uncaught()
            raise
        rt = _build_runtime(settings, membership, transport, sets)
        _state.install(rt)
        rt.engine.start()
        _install_failure_reporter()
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def _join(settings: Settings, comm: Any, process_sets: Sequence[ProcessSet] | None
          ) -> tuple[Settings, bootstrap.Membership, Transport, list[ProcessSet]]:
    """Join a round and connect to its members. An elastic worker whose round is superseded while
    it connects (a host left as another came) joins the newer round, as `hvd.elastic.run` does
    after a failure; each attempt is bounded by the start timeout."""
    while True:
        membership = bootstrap.join(settings, _state.last_round(), comm)
        _state.record_round(membership.round)
        # From here on the slot is the bootstrap's: everything below reads it from these settings.
        joined = membership.settings_for(settings)
        try:
            transport, sets = _connect(joined, membership, process_sets)
        except HorovodInternalError:
            if not settings.elastic:
                raise
            continue
        return joined, membership, transport, sets


def _connect(settings: Settings, membership: bootstrap.Membership,
             process_sets: Sequence[ProcessSet] | None) -> tuple[Transport, list[ProcessSet]]:
    """The round's transport, and the static process sets every rank agreed on."""
    topo = settings.topology
    transport = None
    try:
        transport = create_transport(settings.cpu_operations, TransportContext(
            topo, settings, membership.rendezvous, membership.round, membership.communicator))
        sets = register_static(process_sets, topo.size, membership.communicator)
        check_static_sets_agree(transport, sets)
    except BaseException as exc:
        # Nothing of a failed init may linger: no connection, no thread, no shared memory.
        if transport is not None:
            transport.close()
        membership.close()
        if isinstance(exc, (PeerFailure, TimeoutError)):
            raise HorovodInternalError(f"hvd.init() failed on rank {topo.rank}: {exc}") from None
        raise
    return transport, sets


def _build_runtime(settings: Settings, membership: bootstrap.Membership, transport: Transport,
           sets: list[ProcessSet]) -> Runtime:
    """The runtime of the round (its engine not started yet)."""
    timeline = None
    if settings.topology.rank == 0:
        from horovod.common.timeline import Timeline

        timeline = Timeline()
        if settings.timeline and settings.timeline.upper() != "DYNAMIC":
            timeline.start(settings.timeline, settings.timeline_mark_cycles)
    # The global set's members are the runtime's, which does not exist yet: name them here.
    members = {0: tuple(range(settings.topology.size)), **{ps.process_set_id: tuple(ps.ranks) for ps in sets[1:]}}
    engine = Engine(settings, transport, members, timeline)
    return Runtime(settings, membership.round, transport, engine, membership.rendezvous, timeline,
                   {ps.process_set_id: ps for ps in sets})


def shutdown() -> None:
    """Leave the job: stops this rank's engine and, after the current cycle, every other rank's."""
    _leave(wait_for_peers=not _exiting_with_error)


def abort(exc: BaseException) -> None:
    """Leave the current round at once because of `exc`, recording it and telling the peers that
    this rank failed. Unlike an uncaught exception this does not end the process, which may
    `init()` again: a Ray actor goes on to run the executor's next function."""
    report_failure("".join(traceback.format_exception(exc)))
    _leave(wait_for_peers=False)


def _leave(wait_for_peers: bool) -> None:
    with _state.lock:
        rt = _state.uninstall()
        if rt is None:
            return
        rt.engine.request_shutdown(wait_for_peers=wait_for_peers)
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
        record_failure(exc)
        previous(exc_type, exc, tb)

    report._horovod_reporter = True  # type: ignore[attr-defined]
    sys.excepthook = report


def record_failure(exc: BaseException) -> None:
    """This process goes down because of `exc`: record it for the launcher (`report_failure`),
    and make `shutdown()` leave at once, telling the peers that this rank failed."""
    global _exiting_with_error
    _exiting_with_error = True
    report_failure("".join(traceback.format_exception(exc)))


def report_failure(text: str) -> None:
    """Write `failures/<rank>` in the rendezvous store once per process (best effort).

    When this rank had already seen peers leave or die, `failures/after.<rank>` names them first:
    its error is then most likely their consequence, and the launcher reports theirs instead,
    whichever process exits first (docs/internals.md).
    """
    global _failure_reported
    rt = _state.peek()
    if _failure_reported or rt is None or rt.rendezvous is None:
        return
    _failure_reported = True
    rank = str(rt.settings.topology.rank)
    departed = rt.engine.departed_peers()
    try:
        if departed:
            rt.rendezvous.put("failures", f"after.{rank}", ",".join(map(str, sorted(departed))).encode())
        rt.rendezvous.put("failures", rank, text.encode("utf-8", "replace"))
    except OSError:
        pass


def is_initialized() -> bool:
    """True between `init()` and `shutdown()`."""
    return _state.peek() is not None


def _topology() -> Topology:
    return _state.current().settings.topology


def size() -> int:
    """The number of ranks in the job."""
    return _topology().size


def rank() -> int:
    """This process's rank, from 0 to `size() - 1`."""
    return _topology().rank


def local_size() -> int:
    """The number of ranks on this host."""
    return _topology().local_size


def local_rank() -> int:
    """This rank's position among the ranks of its host (which GPU to use)."""
    return _topology().local_rank


def cross_size() -> int:
    """The number of ranks with this rank's local rank: the number of hosts, in a homogeneous job."""
    return _topology().cross_size


def cross_rank() -> int:
    """This rank's position among the ranks with its local rank (one per host)."""
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
    """Stop writing the timeline that `start_timeline` (or `HOROVOD_TIMELINE`) started."""
    rt = runtime()
    if rt.timeline is not None:
        rt.timeline.stop()


# Build queries, with Horovod's names and types. Our TCP transport plays Gloo's role.
def gloo_built() -> bool:
    """Always True: the built-in TCP transport plays Gloo's part."""
    return True


def gloo_enabled() -> bool:
    """True unless the collectives run through MPI."""
    return not mpi_enabled()


def mpi_built() -> bool:
    """True when the MPI path can run here: mpi4py and an MPI library it loads."""
    return mpi_library.usable()


def mpi_enabled() -> bool:
    """True while the collectives run through MPI (HOROVOD_CPU_OPERATIONS=mpi, or a job mpirun started)."""
    rt = _state.peek()
    return rt is not None and rt.transport.name == "mpi"


def mpi_threads_supported() -> bool:
    """Whether the MPI library gives MPI_THREAD_MULTIPLE (the engine needs it to use MPI at all)."""
    if not mpi_enabled():
        raise ValueError("MPI is not enabled: khorovod runs on its own transport here; start the job with "
                         "mpirun or horovodrun --mpi, or set HOROVOD_CPU_OPERATIONS=mpi")
    return mpi_library.threads_supported()


def nccl_built() -> int:
    """NCCL's version code (e.g. 22803 for 2.28.3) where a libnccl loads, else 0. Found as the
    device transport finds it (`HOROVOD_NCCL_LIB`, the GPU frameworks' wheels, the copy loaded)."""
    from horovod.common.transport.nccl import library

    rt = _state.peek()
    return library.find(rt.settings if rt is not None else Settings.from_env()).version


def ccl_built() -> bool:
    """Always False: khorovod has no oneCCL path."""
    return False


def ddl_built() -> bool:
    """Always False: khorovod has no IBM DDL path."""
    return False


def cuda_built() -> bool:
    """True where the CUDA runtime library loads and sees a GPU: device tensors can be moved."""
    from horovod.common.device.cuda_runtime import runtime as cuda_runtime

    cuda = cuda_runtime()
    return cuda is not None and cuda.device_count() > 0


def rocm_built() -> bool:
    """Always False: khorovod has no ROCm (RCCL) path."""
    return False


def _get_process_set_ids_and_ranks() -> dict[int, list[int]]:
    """Every registered process set's id and its ranks, the global set (0) included. Horovod's
    private query, kept under its name because its process-set tests read it through
    `mpi_ops._basics`."""
    return {set_id: list(ps.ranks) for set_id, ps in sorted(runtime().process_sets.items())}
