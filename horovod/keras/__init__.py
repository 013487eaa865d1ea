"""Horovod for Keras 3, on the tensorflow, torch or jax backend (whichever KERAS_BACKEND selects).

    import keras
    import horovod.keras as hvd

    hvd.init()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size())), loss=...)
    model.fit(x_shard, y_shard, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)
"""

from horovod._keras import (
    Compression,
    DistributedOptimizer,
    PartialDistributedOptimizer,
    allgather,
    allreduce,
    broadcast,
    broadcast_global_variables,
    load_model,
    reducescatter,
)
from horovod._keras.transport import check_backend as _check_backend
from horovod.common import *  # noqa: F401,F403  (basics, op constants, process sets)
from horovod.common import __all__ as _common_all
from horovod.keras import callbacks, elastic

_check_backend()

__all__ = [*_common_all,
    "Compression", "DistributedOptimizer", "PartialDistributedOptimizer", "allgather", "allreduce", "broadcast",
    "broadcast_global_variables", "callbacks", "elastic", "load_model", "reducescatter",
]
