"""The bootstrap of a job that `mpirun`/`mpiexec` started: the slot comes from MPI itself.

No launcher of ours, no rendezvous store: rank and size are the job communicator's
(MPI_COMM_WORLD, or what `init(comm=...)` names); the ranks sharing this host are those MPI
puts in one shared-memory communicator (as Horovod does), and the cross communicator joins
the ranks of equal local rank. Rounds have no store to number them: every member counts its
own `init()` calls, which agree because `init()` and `shutdown()` are collective. Where mpi4py is
not installed, the launcher's variables give the slot (`launcher_env`); the transport then
refuses a job of several ranks, naming what to install.
"""

from __future__ import annotations

import platform
from typing import Any

from horovod.common import mpi_library
from horovod.common.bootstrap.base import Membership
from horovod.common.settings import Settings, Topology


class MpiBootstrap:
    """The slot of this process in the job communicator."""

    def join(self, settings: Settings, previous_round: int, comm: Any = None) -> Membership:
        if comm is None and not mpi_library.available():
            return Membership(launcher_topology(settings), None, previous_round + 1)
        MPI = mpi_library.load()
        if settings.slurm_tasks > MPI.COMM_WORLD.size:
            raise ValueError(f"srun started {settings.slurm_tasks} tasks but MPI sees {MPI.COMM_WORLD.size}: "
                             "run srun with --mpi=pmix (or set MpiDefault=pmix in slurm.conf)")
        job = mpi_library.job_communicator(comm)
        if job is None:
            raise ValueError(f"MPI_COMM_WORLD rank {MPI.COMM_WORLD.rank} is not part of the job that "
                             f"init(comm={comm!r}) describes; only its members may call init()")
        return Membership(topology_of(job), None, previous_round + 1, communicator=job)


def launcher_topology(settings: Settings) -> Topology:
    """The slot mpirun's or srun's variables give, where mpi4py is not installed to ask MPI."""
    slot = settings.launcher_slot
    if slot is None:
        raise ImportError("HOROVOD_BOOTSTRAP=mpi: this process was not started by mpirun or srun, and mpi4py "
                          f"is not installed to ask MPI who it is; {mpi_library.INSTALL_HINT}")
    return Topology(rank=slot.rank, size=slot.size, local_rank=slot.local_rank, local_size=slot.local_size,
                    cross_rank=slot.cross_rank, cross_size=slot.cross_size, hostname=platform.node() or "localhost")


def topology_of(comm: Any) -> Topology:
    """Rank, size, local and cross ranks of this process in `comm`, as MPI sees the hosts."""
    MPI = mpi_library.load()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    cross = comm.Split(color=local.rank, key=comm.rank)
    try:
        return Topology(rank=comm.rank, size=comm.size, local_rank=local.rank, local_size=local.size,
                        cross_rank=cross.rank, cross_size=cross.size, hostname=MPI.Get_processor_name())
    finally:
        local.Free()
        cross.Free()
