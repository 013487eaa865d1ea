"""Helpers that start every rank from the same point: parameter pytrees and Python objects."""

from __future__ import annotations

from typing import Any

import jax

from horovod.common import ops
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.jax._bridge import is_traced, start
from horovod.jax.mpi_ops import broadcast

__all__ = ["allgather_object", "broadcast_object", "broadcast_parameters"]


def broadcast_parameters(params: Any, root_rank: int = 0, process_set: ProcessSet = global_process_set) -> Any:
    """`root_rank`'s pytree of arrays (model parameters, optimizer state), returned on every rank.

    JAX arrays are immutable, so the broadcast tree is returned rather than written in place.
    Outside `jit` every leaf is in flight at once before any is waited on."""
    leaves, tree = jax.tree_util.tree_flatten(params)
    names = [f"broadcast_parameters.{i}" for i in range(len(leaves))]
    if is_traced(leaves):
        out = [broadcast(leaf, root_rank, name, process_set) for leaf, name in zip(leaves, names)]
    else:
        pending = [start("broadcast", [leaf], root_rank=root_rank, name=name, process_set=process_set)
                   for leaf, name in zip(leaves, names)]
        out = [p.wait() for p in pending]
    return jax.tree_util.tree_unflatten(tree, out)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """`root_rank`'s object (anything cloudpickle can serialise), returned on every rank."""
    return ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's object, as a list indexed by rank within the set."""
    return ops.allgather_object(obj, name, process_set)
