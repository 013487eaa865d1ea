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


@dataclass(frozen=True)
class TorchLaunch:
    """What a torch-style launcher (torchrun, Kubeflow's PyTorchJob, JobSet) tells each process:
    its slot, where torch's own store is, and which attempt of the job this is."""

    slot: LauncherSlot
    master_addr: str
    master_port: int
    restart_count: int  # torchrun's TORCHELASTIC_RESTART_COUNT: a restarted job meets afresh
    agent_store: bool  # torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT


#: The variables whose presence says a torch-style launcher started this process.
TORCH_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: Where the launcher gives the index of this process's host (torchrun, PyTorchJob, JobSet), in order.
_NODE_RANK_VARIABLES = ("GROUP_RANK", "NODE_RANK", "JOB_COMPLETION_INDEX")


def torch_launch(env: Mapping[str, str]) -> TorchLaunch | None:
    """The torch-style launch `env` describes; None unless every `TORCH_LAUNCH_VARIABLES` is set.
    A process with no LOCAL_* variables is alone on its host (a PyTorchJob pod of one process)."""
    if not all(env.get(name, "").strip() for name in TORCH_LAUNCH_VARIABLES):
        return None
    size, rank = _number(env, "WORLD_SIZE"), _number(env, "RANK")
    local_size, local_rank = _number(env, "LOCAL_WORLD_SIZE", 1), _number(env, "LOCAL_RANK")
    port = _number(env, "MASTER_PORT")
    if size < 1:
        raise ValueError(f"WORLD_SIZE={size} must be at least 1")
    for name, value, limit in (("RANK", rank, size), ("LOCAL_RANK", local_rank, local_size)):
        if not 0 <= value < limit:
            raise ValueError(f"{name}={value} must be between 0 and {limit - 1} "
                             f"({'WORLD_SIZE' if name == 'RANK' else 'LOCAL_WORLD_SIZE'}={limit})")
    if not 0 < local_size <= size:
        raise ValueError(f"LOCAL_WORLD_SIZE={local_size} must be between 1 and WORLD_SIZE={size}")
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT={port} is not a TCP port")
    hosts = -(-size // local_size)
    last = size - (hosts - 1) * local_size  # the last host may hold fewer ranks
    node = next((name for name in _NODE_RANK_VARIABLES if env.get(name, "").strip()), None)
    cross_rank = _number(env, node) if node else rank // local_size
    if not 0 <= cross_rank < hosts:
        raise ValueError(f"{node}={cross_rank} but WORLD_SIZE={size} and LOCAL_WORLD_SIZE={local_size} "
                         f"make {hosts} host(s)")
    slot = LauncherSlot("torchrun", rank, size, local_rank, local_size, cross_rank,
                        hosts if local_rank < last else hosts - 1)
    return TorchLaunch(slot, env["MASTER_ADDR"].strip(), port, _number(env, "TORCHELASTIC_RESTART_COUNT"),
                       env.get("TORCHELASTIC_USE_AGENT_STORE", "").strip() == "True")


#: Variables in which a launcher states the job's size, in the order they are reported.
SIZE_VARIABLES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def launcher_sizes(env: Mapping[str, str]) -> tuple[tuple[str, int], ...]:
    """(variable, value) for each of `SIZE_VARIABLES` that says the job has several processes.
    Slurm's SLURM_NTASKS counts only inside a job step (srun): a batch script sees it too."""
    found = []
    for name in SIZE_VARIABLES:
        if name == "SLURM_NTASKS" and not env.get("SLURM_STEP_ID"):
            continue
        raw = env.get(name, "").strip()
        if raw.isdigit() and int(raw) > 1:
            found.append((name, int(raw)))
    return tuple(found)


def check_not_alone(bootstrap: str, size: int, sizes: tuple[tuple[str, int], ...]) -> None:
    """ValueError when the bootstrap found a job of one while a launcher says there are more:
    every process would otherwise train alone, silently."""
    if size != 1 or not sizes:
        return
    name, value = sizes[0]
    raise ValueError(
        f"hvd.init() found this process alone (bootstrap {bootstrap!r}, size 1) but {name}={value} says the "
        f"job has {value} processes, so each would train on its own. Start the job with horovodrun, mpirun, "
        "srun or torchrun (with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set), or choose the bootstrap "
        f"with HOROVOD_BOOTSTRAP; unset {name} if this process really is meant to run alone")
