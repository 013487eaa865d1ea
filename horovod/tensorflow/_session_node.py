"""Collectives in TF1 graphs (`tf.compat.v1.Session`) that never hold an inter-op thread while waiting.

A session runs the independent ops of a graph in whatever order its inter-op threads pick, and
that order differs between ranks. A synchronous kernel that waits for the other ranks blocks one
of those threads; with several collectives in a graph, rank 0 can hold its threads waiting in A
while rank 1 holds its threads waiting in B, and neither ever submits the other's op. Horovod's
C++ kernels are asynchronous for this reason. Python cannot register an asynchronous kernel, but
TensorFlow has one that waits on Python: `IteratorGetNext`, which computes its element on its own
background thread. So one collective is two nodes:

* submit (`tf.numpy_function`, on an inter-op thread, never blocks): hands the inputs to the core
  and leaves the pending result in the node's slot;
* wait (`IteratorGetNext` of an endless dataset whose element is "take the slot and wait for it",
  computed on the iterator's private thread): depends on submit by a control edge.

Every collective whose inputs are ready is therefore submitted on every rank, whatever the order,
and the engine's negotiation pairs them up. `tf.function` does not need this: it runs stateful
ops (our `tf.py_function` nodes) in program order, which is the same on every rank.

A node is meant to run once per `session.run` (as Horovod's ops are): two sessions running the
same collective node at the same time would share its slot.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

# What `_bridge` gives us: submit these input arrays now, return a function that waits for the outputs.
Submit = Callable[[list[np.ndarray]], Callable[[], list[np.ndarray]]]


def _waiting_iterator(slot: deque, dtypes: Sequence[tf.DType], label: str) -> Any:
    """An iterator whose every element is the result of the submission in `slot`."""

    def finish(_: Any) -> list[np.ndarray]:
        if not slot:
            raise RuntimeError(f"{label}: the collective's submit node did not run before its wait node")
        return slot.popleft()()

    endless = tf.data.Dataset.from_tensors(np.int64(0)).repeat()
    waiting = endless.map(lambda tick: tf.numpy_function(finish, [tick], list(dtypes), stateful=True))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1  # waits never run on the session's inter-op threads
    options.experimental_optimization.apply_default_optimizations = False  # no prefetch: one element per run
    options.autotune.enabled = False
    return tf.compat.v1.data.make_one_shot_iterator(waiting.with_options(options))


def session_node(inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType], submit: Submit,
                 label: str) -> list[tf.Tensor]:
    """The outputs of a collective as a submit node and an asynchronous wait node (see above)."""
    slot: deque = deque(maxlen=1)  # a later submission replaces one an aborted run left behind

    def start(*arrays: np.ndarray) -> np.int64:
        slot.append(submit([np.asarray(a) for a in arrays]))
        return np.int64(0)

    submitted = tf.numpy_function(start, list(inputs), tf.int64, stateful=True, name=label)
    with tf.init_scope():  # the iterator lives outside any cond/while context the op is built in
        iterator = _waiting_iterator(slot, dtypes, label)
    with tf.control_dependencies([submitted]):
        outputs = iterator.get_next(name=f"{label}Wait")
    return list(outputs)
