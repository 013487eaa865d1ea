"""Keras 3 support written once for every backend; `horovod.keras` and `horovod.tensorflow.keras`
are its public faces.

Values passed to the functions here (numbers, numpy arrays, backend tensors) travel as numpy
arrays and come back as numpy arrays, as Horovod's Keras functions return them.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import keras
import numpy as np

from horovod._keras.compression import Compression
from horovod._keras.optimizer import DistributedOptimizer, keras2_optimizer_types, keras2_reducer
from horovod._keras.xla import compile_distributed_models_without_xla
from horovod.common import ops as core
from horovod.common.compression import Compressor
from horovod.common.gradients import resolve_op
from horovod.common.reduce_ops import Average

compile_distributed_models_without_xla()


def _array(value: Any, compression: type[Compressor] = Compression.none) -> tuple[np.ndarray, Any]:
    tensor, ctx = compression.compress(keras.ops.convert_to_tensor(value))
    return np.asarray(keras.ops.convert_to_numpy(tensor), order="C"), ctx


def allreduce(value: Any, name: str | None = None, average: bool | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op: int | None = None,
              compression: type[Compressor] = Compression.none) -> np.ndarray:
    """`value` reduced over all ranks (Average by default), as a numpy array."""
    array, ctx = _array(value, compression)
    out = core.allreduce_async(array, name, resolve_op(op, average), prescale_factor, postscale_factor).wait()
    if ctx is None:
        return out
    return keras.ops.convert_to_numpy(compression.decompress(keras.ops.convert_to_tensor(out), ctx))


def allgather(value: Any, name: str | None = None) -> np.ndarray:
    """Every rank's `value` concatenated along dim 0."""
    return core.allgather_async(_array(value)[0], name).wait()


def broadcast(value: Any, root_rank: int, name: str | None = None) -> np.ndarray:
    """`value` as the global rank `root_rank` has it."""
    return core.broadcast_async(_array(value)[0], root_rank, name).wait()


def reducescatter(value: Any, name: str | None = None, op: int = Average) -> np.ndarray:
    """`value` reduced over all ranks; this rank keeps its block of dim 0."""
    return core.reducescatter_async(_array(value)[0], name, op).wait()


def broadcast_global_variables(root_rank: int) -> None:
    """Not available with Keras 3, which keeps no global collection of variables."""
    raise RuntimeError("broadcast_global_variables() needs TF1 global variables, which Keras 3 does not have. "
                       "Pass hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank) to model.fit(), or call "
                       "hvd.broadcast_variables(model.variables, root_rank) with horovod.tensorflow.")


def PartialDistributedOptimizer(optimizer: keras.optimizers.Optimizer, name: str | None = None,
                                local_layers: Any = None, **kwargs: Any) -> DistributedOptimizer:
    """A DistributedOptimizer whose `local_layers` (a layer or a list) keep their gradients local."""
    distributed = DistributedOptimizer(optimizer, name=name, **kwargs)
    layers = [] if local_layers is None else local_layers if isinstance(local_layers, (list, tuple)) else [local_layers]
    for layer in layers:
        for var in layer.trainable_weights:
            distributed.register_local_var(var)
    return distributed


def load_model(filepath: str, custom_optimizers: Sequence[type] | None = None, custom_objects: dict | None = None,
               compression: type[Compressor] = Compression.none, legacy_opts: bool = False) -> keras.Model:
    """Load a saved Keras model and make its optimizer a DistributedOptimizer.

    A model saved with a DistributedOptimizer comes back with one; a model saved with a plain
    optimizer gets it wrapped (its restored state kept), with `compression`. `legacy_opts` is
    accepted for compatibility (Keras 3 has no legacy optimizers)."""
    objects = dict(custom_objects or {})
    objects.update({cls.__name__: cls for cls in custom_optimizers or []})
    objects.setdefault("DistributedOptimizer", DistributedOptimizer)
    if _saved_by_keras2(filepath):
        return _load_keras2_model(filepath, objects, compression)
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not isinstance(optimizer, DistributedOptimizer):
        model.optimizer = DistributedOptimizer(optimizer, compression=compression)
    return model


def _saved_by_keras2(filepath: str) -> bool:
    """Under TF_USE_LEGACY_KERAS=1 `tf.keras` is tf_keras: its models are Keras 2's, saved and loaded by it."""
    tf = sys.modules.get("tensorflow")
    return bool(keras2_optimizer_types()) and tf is not None and tf.keras.__name__.startswith("tf_keras")


def _load_keras2_model(filepath: str, objects: dict, compression: type[Compressor]) -> Any:
    """A tf_keras model whose restored optimizer (state and all) is made distributed in place."""
    import tf_keras

    from horovod._keras.keras2 import make_distributed

    model = tf_keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        make_distributed(optimizer, keras2_reducer(optimizer, compression=compression))
    return model


__all__ = ["Compression", "DistributedOptimizer", "PartialDistributedOptimizer", "allgather", "allreduce",
           "broadcast", "broadcast_global_variables", "load_model", "reducescatter"]
