"""The bootstrap of a job that `mpirun`/`mpiexec` started: the slot comes from MPI itself.

No launcher of ours, no rendezvous store: rank and size are the job communicator's
(MPI_COMM_WORLD, or what `init(comm=...)` names); the ranks sharing this host are those MPI
puts in one shared-memory communicator (as Horovod does), and the cross communicator joins
the ranks of equal local rank. Rounds have no store to number them: every member counts its
own `init()` calls, which agree because `init()` and `shutdown()` are collective.
"""

from __future__ import annotations

from typing import Any

from horovod.common import mpi_library
from horovod.common.bootstrap.base import Membership
from horovod.common.settings import Settings, Topology


class MpiBootstrap:
    """The slot of this process in the job communicator."""

    def join(self, settings: Settings, previous_round: int, comm: Any = None) -> Membership:
        MPI = mpi_library.load()
        if settings.slurm_tasks > MPI.COMM_WORLD.size:
            raise ValueError(f"srun started {settings.slurm_tasks} tasks but MPI sees {MPI.COMM_WORLD.size}: "
                             "run srun with --mpi=pmix (or set MpiDefault=pmix in slurm.conf)")
        job = mpi_library.job_communicator(comm)
        if job is None:
            raise ValueError(f"MPI_COMM_WORLD rank {MPI.COMM_WORLD.rank} is not part of the job that "
                             f"init(comm={comm!r}) describes; only its members may call init()")
        return Membership(topology_of(job), None, previous_round + 1, communicator=job)


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
