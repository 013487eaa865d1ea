"""Horovod for MXNet: `import horovod.mxnet as hvd`.

    hvd.init()
    net = build_net(); net.initialize(); net(sample)            # parameters exist
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1 * hvd.size()})
    with mx.autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(batch_size)                                    # gradients averaged across ranks

MXNet 1.9.1 needs numpy<1.24: see docs/mxnet.md for its environment.
"""

from horovod.common import *  # noqa: F401,F403  (basics, op constants, process sets, exceptions)
from horovod.common import __all__ as _common_all
from horovod.mxnet.compression import Compression
from horovod.mxnet.functions import allgather_object, broadcast_object, broadcast_parameters
from horovod.mxnet.mpi_ops import (
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    join,
    reducescatter,
)
from horovod.mxnet.optimizer import DistributedOptimizer, DistributedTrainer

__all__ = [
    *_common_all,
    "Compression", "DistributedOptimizer", "DistributedTrainer", "allgather", "allgather_object", "allreduce",
    "allreduce_", "alltoall", "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_parameters",
    "grouped_allgather", "grouped_allreduce", "grouped_allreduce_", "grouped_reducescatter", "join",
    "reducescatter",
]
