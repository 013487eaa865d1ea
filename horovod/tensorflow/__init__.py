"""Horovod for TensorFlow 2 (tested on 2.21 with Keras 3), eager and inside `tf.function`.

    import tensorflow as tf
    import horovod.tensorflow as hvd

    hvd.init()
    ...
    with tf.GradientTape() as tape:
        loss = loss_fn(model(x), y)
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    if first_step:
        hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0)

Collectives run on the CPU through the host (`device_dense`/`device_sparse` arguments are
accepted and ignored). Not supported: XLA (`jit_compile=True`) around a collective.
"""

from horovod.common import *  # noqa: F401,F403  (basics, op constants, process sets)
from horovod.common import __all__ as _common_all
from horovod.common.util import gpu_available  # noqa: F401  (`hvd.gpu_available("tensorflow")`, as in Horovod)
from horovod.tensorflow.compression import Compression
from horovod.tensorflow.functions import (
    BroadcastGlobalVariablesHook,
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from horovod.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from horovod.tensorflow.mpi_ops import (
    allgather,
    allreduce,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    size_op,
)
from horovod.tensorflow.optimizer import DistributedOptimizer
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization

__all__ = [*_common_all,
    "BroadcastGlobalVariablesHook", "Compression", "DistributedGradientTape", "DistributedOptimizer",
    "PartialDistributedGradientTape",
    "SyncBatchNormalization", "allgather", "allgather_object", "allreduce", "alltoall", "broadcast", "broadcast_",
    "broadcast_global_variables", "broadcast_object", "broadcast_object_fn", "broadcast_variables",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "join", "local_rank_op", "local_size_op",
    "process_set_included_op", "rank_op", "reducescatter", "size_op",
]


def __getattr__(name: str) -> object:
    """`hvd.elastic` is imported on first use: it brings in Keras, which plain TensorFlow users need not load."""
    if name == "elastic":
        import importlib

        return importlib.import_module("horovod.tensorflow.elastic")
    raise AttributeError(f"module 'horovod.tensorflow' has no attribute {name!r}")
