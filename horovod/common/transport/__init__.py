"""Transports, chosen by name (`HOROVOD_CPU_OPERATIONS`): each moves bytes between ranks.

Built in: `tcp` (a full mesh, ring allreduce), `shm` (shared memory among the ranks of a host,
TCP across hosts) and `hierarchical` (shm, plus hierarchical allreduce/allgather for groups that
span hosts). `auto`, the default (also what Horovod's `gloo` means here), picks `shm` when every
rank is on one host, `hierarchical` when there are several, and `tcp` where shared memory is not
available (not Linux, no writable /dev/shm) or for a single rank.
"""

from __future__ import annotations

from typing import Any, Callable

from horovod.common.transport.base import PeerFailure, Transport

_REGISTRY: dict[str, Callable[..., Transport]] = {}
_ALIASES = {"": "auto", "gloo": "auto"}


def register(name: str, factory: Callable[..., Transport]) -> None:
    _REGISTRY[name] = factory


def default_name(topology: Any) -> str:
    """The transport `auto` stands for, given this rank's topology."""
    from horovod.common.transport.shm import shared_memory_usable

    if topology is None or topology.size == 1 or not shared_memory_usable():
        return "tcp"
    return "shm" if topology.local_size == topology.size else "hierarchical"


def create(name: str, **kwargs: object) -> Transport:
    """Build the transport called `name` (see the module docstring for the choices)."""
    from horovod.common.transport import hierarchical, shm, tcp  # noqa: F401  (they register themselves)

    key = _ALIASES.get(name, name)
    if key == "auto":
        key = default_name(kwargs.get("topology"))
    if key not in _REGISTRY:
        raise ValueError(
            f"HOROVOD_CPU_OPERATIONS={name!r} is not an available transport; "
            f"choose one of: auto, {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[key](**kwargs)


__all__ = ["PeerFailure", "Transport", "create", "default_name", "register"]
