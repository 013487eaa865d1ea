"""How one step's gradients reach the core from each Keras 3 backend.

* tensorflow: `horovod.tensorflow`'s graph node / eager path (IndexedSlices included);
* torch, and jax outside `jit`: the tensors' numpy values, reduced, converted back;
* jax inside `jit` (Keras' default): one host callback per step around the same numpy-level
  reduction (`horovod.jax._bridge`), so the traced step stays a pure function.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import keras
import numpy as np

from horovod.common.gradients import GradientReducer, Plan

SUPPORTED_BACKENDS = ("tensorflow", "torch", "jax")


def check_backend() -> str:
    backend = keras.backend.backend()
    if backend not in SUPPORTED_BACKENDS:
        raise NotImplementedError(f"horovod.keras supports the Keras backends {', '.join(SUPPORTED_BACKENDS)}; "
                                  f"this process uses '{backend}' (set KERAS_BACKEND)")
    return backend


def is_traced_jax(values: Sequence[Any]) -> bool:
    """True inside a jax transformation (jit), where values are tracers without data."""
    if keras.backend.backend() != "jax":
        return False
    from horovod.jax._bridge import is_traced

    return is_traced(values)


def static_bool(value: Any) -> bool | None:
    """`value` as a Python bool when it is known now (eager code), None inside a traced graph."""
    if is_traced_jax([value]):
        return None
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if not tf.executing_eagerly():
            return None
    return bool(keras.ops.convert_to_numpy(value))


def allreduce_gradients(reducer: GradientReducer, grads: Sequence[Any], variables: Sequence[Any],
                        sparse_as_dense: bool = False) -> list[Any]:
    """`grads` reduced across ranks as `reducer` says, on whatever backend Keras runs."""
    if check_backend() == "tensorflow":
        from horovod.tensorflow.gradient_tape import allreduce_gradients as tf_allreduce_gradients

        return tf_allreduce_gradients(reducer, grads, variables, sparse_as_dense)
    return reducer.reduce(grads, variables, partial(_host_transport, reducer), lambda g, f: g * f)


def _host_transport(reducer: GradientReducer, tensors: list[Any], plan: Plan) -> list[Any]:
    def reduce_arrays(*arrays: Any) -> list[np.ndarray]:
        return reducer.submit([np.asarray(a) for a in arrays], plan)()

    if is_traced_jax(tensors):
        from horovod.jax._bridge import host_callback

        return host_callback(reduce_arrays, tensors)
    reduced = reduce_arrays(*(keras.ops.convert_to_numpy(t) for t in tensors))
    return [keras.ops.convert_to_tensor(a) for a in reduced]
