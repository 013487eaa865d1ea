"""`get_env_rank_and_size()`: this process's rank and the job's size before `hvd.init()`, from the
variables its launcher set (Horovod's tests call it to build process sets before init)."""

from __future__ import annotations

import os

# (rank, size) variables, in the order Horovod looks at them: horovodrun, Open MPI, MPICH/Intel MPI.
_LAUNCHER_VARIABLES = (("HOROVOD_RANK", "HOROVOD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("PMI_RANK", "PMI_SIZE"))


def get_env_rank_and_size() -> tuple[int, int]:
    """(rank, size) from the first launcher whose variables are set; (0, 1) when none is.
    RuntimeError when a launcher set only one of the pair."""
    for rank_name, size_name in _LAUNCHER_VARIABLES:
        rank, size = os.environ.get(rank_name), os.environ.get(size_name)
        if rank is not None and size is not None:
            return int(rank), int(size)
        if rank is not None or size is not None:
            raise RuntimeError(f"Could not determine process rank and size: only one of {rank_name} and "
                               f"{size_name} found in environment")
    return 0, 1
