"""A Keras model as bytes and back, for the store and the Keras estimator (apart from both, so
that the store can read a saved model without importing the estimator that uses the store)."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def model_to_bytes(model: Any) -> bytes:
    """A Keras model as the bytes of its `.keras` file (Keras 3 saves only to a path)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def model_from_bytes(data: bytes, compile: bool = True, custom_objects: dict[str, Any] | None = None) -> Any:
    """The model of `model_to_bytes`; a trained one was compiled with `hvd.DistributedOptimizer`,
    which Keras finds once `horovod.keras` has registered it. `custom_objects`: the user's own
    layers, losses, ... by name (the estimator's `custom_objects`)."""
    import keras

    import horovod.keras  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.models.load_model(path, compile=compile, custom_objects=custom_objects)
