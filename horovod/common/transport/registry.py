"""Transports by name: a table of lazy factories, so no backend is imported before it is chosen
and no backend imports this table."""

from __future__ import annotations

import importlib

from horovod.common.settings import Topology
from horovod.common.transport.base import Transport, TransportContext

# name -> "module:Class"; every class is built as Class(context).
FACTORIES = {
    "tcp": "horovod.common.transport.tcp:TcpTransport",
    "shm": "horovod.common.transport.shm:ShmTransport",
    "hierarchical": "horovod.common.transport.hierarchical:HierarchicalTransport",
}
_ALIASES = {"": "auto", "gloo": "auto"}


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
        key = default_name(context.topology)
    if key not in FACTORIES:
        raise ValueError(
            f"HOROVOD_CPU_OPERATIONS={name!r} is not an available transport; "
            f"choose one of: auto, {', '.join(sorted(FACTORIES))}"
        )
    module, cls = FACTORIES[key].split(":")
    return getattr(importlib.import_module(module), cls)(context)
