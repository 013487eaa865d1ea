"""How many of the machine's cores one rank can count on: what decides whether a framework adapter
overlaps communication with backward (the torch hooks, the TensorFlow submit nodes), since
overlapping only pays where the engine's work does not take the core that backward runs on."""

from __future__ import annotations

import os


def cores_per_rank(local_size: int) -> float:
    """How many cores this rank can count on: its own share where it is placed (by us, mpirun,
    srun or taskset), else an even share of the machine with the other ranks of its host."""
    if not hasattr(os, "sched_getaffinity"):
        return (os.cpu_count() or 1) / max(local_size, 1)
    allowed = len(os.sched_getaffinity(0))
    return allowed / max(local_size, 1) if allowed == os.cpu_count() else float(allowed)


def overlap_backward(choice: bool | None, local_size: int, on_device: bool = False) -> bool:
    """Whether an adapter submits each gradient while backward still runs: as the user's setting
    says (`HOROVOD_TORCH_OVERLAP_BACKWARD`, `HOROVOD_TF_OVERLAP_BACKWARD`), else for gradients on
    a GPU (the reduction runs there, not on backward's core), else where a rank has two cores of
    its own or more."""
    if choice is not None:
        return choice
    return on_device or cores_per_rank(local_size) >= 2
