"""Variables and Python objects across ranks."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from horovod.common import ops as core
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.tensorflow._bridge import broadcast_values, no_autograph


@no_autograph
def broadcast_variables(variables: Sequence[Any], root_rank: int, process_set: ProcessSet = global_process_set,
                        inplace: bool = False) -> Any:
    """Overwrite every variable with its value on the global rank `root_rank`, all in one round
    (eager, or as part of a traced graph). Returns the grouped assignments in a TF1 graph,
    None otherwise. `inplace` is accepted for compatibility (assignment is always in place)."""
    variables = list(variables)
    values = broadcast_values(variables, root_rank, "broadcast_variables", process_set)
    assigns = [var.assign(value) for var, value in zip(variables, values)]
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return tf.group(*assigns)


def broadcast_global_variables(root_rank: int) -> Any:
    """Broadcast every TF1 global variable (graph mode with sessions only, as in Horovod)."""
    if tf.executing_eagerly():
        raise RuntimeError("broadcast_global_variables() needs TF1 graph mode: TensorFlow 2 has no global "
                           "variables. Use hvd.broadcast_variables(model.variables + optimizer.variables, "
                           "root_rank) or the Keras BroadcastGlobalVariablesCallback.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """TF1 `MonitoredTrainingSession` hook: once the session exists, every rank takes the global
    variables of `root_rank`. `device` is accepted for compatibility."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self) -> None:
        if self.bcast_op is None or self.bcast_op.graph is not tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Any picklable object from `root_rank`, on every rank (a Python-level call; `session` is
    accepted for compatibility)."""
    return core.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function that broadcasts its argument from `root_rank`."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every member's picklable object, as a list in rank order."""
    return core.allgather_object(obj, name, process_set)


__all__ = ["BroadcastGlobalVariablesHook", "allgather_object", "broadcast_global_variables", "broadcast_object",
           "broadcast_object_fn",
           "broadcast_variables"]
