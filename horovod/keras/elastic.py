"""`horovod.keras.elastic`: elastic training with Keras 3 (see `horovod._keras.elastic`)."""

from horovod._keras.elastic import (
    CommitStateCallback,
    KerasState,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    run,
)

__all__ = ["CommitStateCallback", "KerasState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]
