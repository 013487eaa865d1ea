"""The slot of a process that mpirun or srun started, read from the launcher's own variables.

MPI itself is the first source of a job's slot (`bootstrap.mpi`). Where mpi4py is not installed,
the launcher's variables still give rank, size and local rank: `hvd.init()` then knows who it is,
a job of one runs, and a job of several fails in `init()` saying which package to install (its
ranks have no other way to meet) instead of hanging. Open MPI and Hydra (MPICH, Intel MPI) give
no host index, so hosts are taken to hold the same number of ranks, filled in order (Open MPI's
`--map-by slot`, what `horovodrun --mpi` asks for); Slurm names the node and its task count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class LauncherSlot:
    """Rank, size, local and cross ranks as the launcher that started this process gives them."""

    launcher: str  # for messages: "mpirun (Open MPI)", "mpiexec (Hydra)", "srun"
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def expand_tasks_per_node(spec: str) -> list[int]:
    """Slurm's tasks per node (`2(x3),1`) as one count per node (`[2, 2, 2, 1]`)."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"SLURM_TASKS_PER_NODE={spec!r} is not Slurm's format")
        counts += [int(match[1])] * int(match[2] or 1)
    return counts


def launcher_slot(env: Mapping[str, str]) -> LauncherSlot | None:
    """The slot Open MPI's, Hydra's or Slurm's variables describe; None when none of them is set."""
    if env.get("OMPI_COMM_WORLD_SIZE"):
        return _even_hosts("mpirun (Open MPI)", env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if env.get("PMI_SIZE") and env.get("MPI_LOCALNRANKS"):
        return _even_hosts("mpiexec (Hydra)", env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if env.get("SLURM_PROCID") and env.get("SLURM_STEP_ID") and env.get("SLURM_STEP_TASKS_PER_NODE"):
        return _slurm(env)
    return None


def _number(env: Mapping[str, str], name: str, default: int = 0) -> int:
    """An integer variable of the launcher; ValueError naming it when it is not one."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: the launcher's variable is not a number") from None


def _even_hosts(launcher: str, env: Mapping[str, str], rank: str, size: str, local_rank: str,
                local_size: str) -> LauncherSlot:
    """The slot from rank, size and local variables, hosts holding `local_size` ranks each in order."""
    n, r = _number(env, size, 1), _number(env, rank)
    local_n = _number(env, local_size, n)
    hosts = -(-n // local_n)
    # The last host may hold fewer ranks: it is in the cross group of local ranks it has.
    last = n - (hosts - 1) * local_n
    lr = _number(env, local_rank)
    return LauncherSlot(launcher, r, n, lr, local_n, r // local_n, hosts if lr < last else hosts - 1)


def _slurm(env: Mapping[str, str]) -> LauncherSlot:
    """The slot of a task of an srun job step: its node index and every node's task count are known."""
    counts = expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
    node = _number(env, "SLURM_NODEID")
    lr = _number(env, "SLURM_LOCALID")
    if node >= len(counts):
        raise ValueError(f"SLURM_NODEID={node} but SLURM_STEP_TASKS_PER_NODE lists {len(counts)} nodes")
    return LauncherSlot("srun", _number(env, "SLURM_PROCID"), sum(counts), lr, counts[node],
                        sum(1 for c in counts[:node] if c > lr), sum(1 for c in counts if c > lr))
