"""Horovod for JAX: `import horovod.jax as hvd`.

    hvd.init()
    params = hvd.broadcast_parameters(init_params, root_rank=0)
    tx = hvd.DistributedOptimizer(optax.adam(1e-3 * hvd.size()))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch):
        grads = jax.grad(loss)(params, batch)          # this rank's shard
        updates, opt_state = tx.update(grads, opt_state, params)   # averaged across ranks
        return optax.apply_updates(params, updates), opt_state

Every collective takes JAX arrays (`allreduce` and `grouped_allreduce` any pytree), runs eagerly
or inside `jax.jit`, and is differentiable. Run with `horovodrun -np 4 python train.py`.
See docs/jax.md.
"""

from typing import TYPE_CHECKING

from horovod.common import *  # noqa: F401,F403  (basics, op constants, process sets, exceptions)
from horovod.common import __all__ as _common_all
from horovod.jax.compression import Compression
from horovod.jax.functions import allgather_object, broadcast_object, broadcast_parameters
from horovod.jax.mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_async,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_async,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_async,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)

if TYPE_CHECKING:  # imported on first use (below); named here for type checkers and the API reference
    from horovod.jax.optimizer import DistributedOptimizer


def __getattr__(name: str) -> object:
    # optax is needed by the optimizer wrapper only: `horovod.keras` on the jax backend imports this
    # package (for its bridge) where optax may not be installed.
    if name == "DistributedOptimizer":
        from horovod.jax.optimizer import DistributedOptimizer

        return DistributedOptimizer
    raise AttributeError(f"module 'horovod.jax' has no attribute '{name}'")

__all__ = [
    *_common_all,
    "Compression", "DistributedOptimizer", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_async", "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_async", "broadcast_object",
    "broadcast_parameters", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll",
    "reducescatter", "reducescatter_async", "synchronize",
]
