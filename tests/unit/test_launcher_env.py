"""The slot mpirun's and srun's own variables give (used where mpi4py is not installed)."""

import pytest

from horovod.common.launcher_env import LauncherSlot, launcher_slot
from horovod.common.settings import Settings


def ompi(rank: int, size: int, local_rank: int, local_size: int) -> dict[str, str]:
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size)}


def test_open_mpi_ranks_over_hosts_filled_in_order():
    assert launcher_slot(ompi(3, 4, 1, 2)) == LauncherSlot("mpirun (Open MPI)", 3, 4, 1, 2, 1, 2)
    # 5 ranks, 2 per host: the third host holds only local rank 0.
    assert launcher_slot(ompi(4, 5, 0, 2)) == LauncherSlot("mpirun (Open MPI)", 4, 5, 0, 2, 2, 3)
    assert launcher_slot(ompi(3, 5, 1, 2)).cross_size == 2


def test_hydra_variables():
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "4"}
    assert launcher_slot(env) == LauncherSlot("mpiexec (Hydra)", 2, 4, 2, 4, 0, 1)


def test_slurm_step_with_uneven_nodes():
    env = {"SLURM_PROCID": "4", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
           "SLURM_NODEID": "2", "SLURM_LOCALID": "0"}
    assert launcher_slot(env) == LauncherSlot("srun", 4, 5, 0, 1, 2, 3)
    env.update(SLURM_PROCID="3", SLURM_NODEID="1", SLURM_LOCALID="1")
    assert launcher_slot(env) == LauncherSlot("srun", 3, 5, 1, 2, 1, 2)


def test_no_launcher_and_bad_values():
    assert launcher_slot({"SLURM_JOB_ID": "7"}) is None  # an allocation, but no job step of srun
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK='x'"):
        launcher_slot({**ompi(0, 2, 0, 2), "OMPI_COMM_WORLD_RANK": "x"})
    with pytest.raises(ValueError, match="SLURM_NODEID=3"):
        launcher_slot({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2",
                       "SLURM_NODEID": "3"})


def test_settings_carry_the_launchers_slot():
    settings = Settings.from_env(ompi(1, 2, 1, 2))
    assert settings.bootstrap == "mpi" and settings.launcher_slot.rank == 1
    assert Settings.from_env({}).launcher_slot is None


def test_get_env_rank_and_size_as_horovods_tests_call_it(monkeypatch):
    from horovod.runner.common.util.env import get_env_rank_and_size

    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                 "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert get_env_rank_and_size() == (0, 1)  # no launcher: one process
    monkeypatch.setenv("PMI_RANK", "2")
    monkeypatch.setenv("PMI_SIZE", "4")
    assert get_env_rank_and_size() == (2, 4)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")  # Open MPI's pair comes first, and is incomplete
    with pytest.raises(RuntimeError, match="only one of OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE"):
        get_env_rank_and_size()
