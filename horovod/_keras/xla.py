"""Keras 3 on TensorFlow compiles a model's train step with XLA when asked (`jit_compile=True`)
and, on a GPU, by default (`jit_compile="auto"`). Our collectives call back into Python, which
XLA cannot compile (see `horovod.tensorflow._bridge.refuse_xla`), and the optimizer's `apply`
runs inside that step. So a model whose optimizer is a `DistributedOptimizer` on the TensorFlow
backend counts, for Keras, as one that does not support XLA, like a model with a string-lookup
layer: "auto" compiles it without XLA, and an explicit `jit_compile=True` gets Keras' own warning
("Model doesn't support `jit_compile=True`. Proceeding with `jit_compile=False`.").

Keras asks one function, `keras.src.trainers.trainer.model_supports_jit`, in both places; that
function is wrapped once, at import. (The JAX backend is left alone: there the reduction runs
inside `jax.jit` through a host callback.)
"""

from __future__ import annotations

from typing import Any, Callable

import keras


def _wrap(model_supports_jit: Callable[[Any], bool]) -> Callable[[Any], bool]:
    def supports_jit(model: Any) -> bool:
        from horovod._keras.optimizer import DistributedOptimizer

        if keras.backend.backend() == "tensorflow" and isinstance(getattr(model, "optimizer", None),
                                                                  DistributedOptimizer):
            return False
        return model_supports_jit(model)

    supports_jit.__wrapped__ = model_supports_jit  # type: ignore[attr-defined]
    return supports_jit


def compile_distributed_models_without_xla() -> None:
    """Install the rule above (once; a Keras without that function is left as it is)."""
    from keras.src.trainers import trainer

    current = getattr(trainer, "model_supports_jit", None)
    if current is not None and not hasattr(current, "__wrapped__"):
        trainer.model_supports_jit = _wrap(current)
