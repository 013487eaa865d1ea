"""`horovod.tensorflow.keras.elastic`: elastic training with tf.keras (Keras 3; see `horovod._keras.elastic`)."""

from horovod.keras.elastic import *  # noqa: F401,F403
from horovod.keras.elastic import __all__  # noqa: F401
