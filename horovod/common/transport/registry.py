"""Transports by name: a table of lazy factories, so naming a backend imports only that backend.

Backends never import this module (a registry that its entries import is a cycle waiting to
happen); adding a backend is one line in `_FACTORIES`.
"""

from __future__ import annotations

from horovod.common.lazy import load
from horovod.common.settings import Topology
from horovod.common.transport.base import Transport, TransportContext

# name -> "module:class"; the class is built as Cls(context).
_FACTORIES: dict[str, str] = {
    "tcp": "horovod.common.transport.tcp:TcpTransport",
    "shm": "horovod.common.transport.shm:ShmTransport",
    "hierarchical": "horovod.common.transport.hierarchical:HierarchicalTransport",
    "mpi": "horovod.common.transport.mpi:MpiTransport",
}
# What users may also write: Horovod's `gloo` (and an empty setting) mean "pick for me".
_ALIASES = {"": "auto", "gloo": "auto"}


def names() -> list[str]:
    """The transports that can be asked for by name (besides `auto`)."""
    return sorted(_FACTORIES)


def default_name(topology: Topology | None) -> str:
    """The transport `auto` stands for, given this rank's topology."""
    from horovod.common.transport.shm import shared_memory_usable

    if topology is None or topology.size == 1 or not shared_memory_usable():
        return "tcp"
    return "shm" if topology.local_size == topology.size else "hierarchical"


def create(name: str, context: TransportContext) -> Transport:
    """Build the transport called `name` (see the package docstring for the choices)."""
    key = _ALIASES.get(name, name)
    if key == "auto":
        # Without a store of ours (a job mpirun started) peers can only meet through MPI.
        key = default_name(context.topology) if context.rendezvous is not None or context.size == 1 else "mpi"
    if key not in _FACTORIES:
        raise ValueError(
            f"HOROVOD_CPU_OPERATIONS={name!r} is not an available transport; "
            f"choose one of: auto, {', '.join(names())}"
        )
    if context.rendezvous is None and context.size > 1 and key != "mpi":
        raise ValueError(
            f"HOROVOD_CPU_OPERATIONS={name!r}: rank {context.rank} of {context.size} has no rendezvous store to "
            f"meet its peers through (mpirun or srun started the job, not horovodrun); such a job moves data "
            "through MPI: leave HOROVOD_CPU_OPERATIONS unset or set it to mpi")
    return load(_FACTORIES[key])(context)
