"""Keras callbacks for data-parallel training: the same classes as `horovod.keras.callbacks`."""

from horovod.keras.callbacks import *  # noqa: F401,F403
from horovod.keras.callbacks import __all__  # noqa: F401
