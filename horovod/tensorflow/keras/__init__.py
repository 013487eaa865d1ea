"""Horovod for `tf.keras`, which on TensorFlow 2.16+ is Keras 3 itself.

The same API as `horovod.keras` (one implementation, in `horovod._keras`), with TensorFlow's
`Compression` and `SyncBatchNormalization`. It requires the Keras backend to be TensorFlow;
for the torch or jax backends use `horovod.keras`.
"""

import keras as _keras

if _keras.backend.backend() != "tensorflow":
    raise ImportError(f"horovod.tensorflow.keras needs the TensorFlow Keras backend, but KERAS_BACKEND is "
                      f"'{_keras.backend.backend()}'; use horovod.keras, which supports tensorflow, torch and jax")

from horovod.keras import *  # noqa: E402,F401,F403
from horovod.keras import __all__ as _keras_all  # noqa: E402
from horovod.tensorflow.compression import Compression  # noqa: E402,F811
from horovod.tensorflow.keras import callbacks, elastic  # noqa: E402,F811
from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: E402

__all__ = [*_keras_all, "SyncBatchNormalization"]
