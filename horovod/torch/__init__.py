"""Horovod for PyTorch: `import horovod.torch as hvd`.

    hvd.init()
    model = Net()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for data, target in shard_of_the_data:
        optimizer.zero_grad()
        loss_fn(model(data), target).backward()
        optimizer.step()

Run it with `horovodrun -np 4 python train.py`. See docs/torch.md.
"""

from horovod.common import *  # noqa: F401,F403  (basics, op constants, process sets, exceptions)
from horovod.common import __all__ as _common_all
from horovod.torch import elastic
from horovod.torch.compression import Compression
from horovod.torch.functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from horovod.torch.mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    init,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from horovod.torch.optimizer import DistributedOptimizer
from horovod.torch.sharded import ShardedDistributedOptimizer
from horovod.torch.sync_batch_norm import SyncBatchNorm

__all__ = [
    *_common_all,
    "Compression", "DistributedOptimizer", "elastic", "SyncBatchNorm", "allgather", "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "broadcast_optimizer_state", "broadcast_parameters", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll", "reducescatter",
    "reducescatter_async", "sparse_allreduce_async", "synchronize",
    "ShardedDistributedOptimizer",  # an extension: optimizer state sharded across the ranks
]
