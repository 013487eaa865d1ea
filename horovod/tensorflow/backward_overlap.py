"""One step's gradients reduced while backward still runs, inside a `tf.function`.

A traced train step (a `tf.function`, Keras `fit`) is a dataflow graph: the executor runs a node
as soon as its inputs exist, on its inter-op threads, and backward produces the gradients of
the last layers first. Put all gradients into one collective node (`_bridge.run`) and that node
waits for the whole of backward before the first byte moves. Here instead:

* each gradient, or each group of `groups=`, gets a *submit* node that hands it to the engine
  and returns at once with a token; it runs as soon as its gradient exists, while the other
  inter-op threads go on with backward, and the engine negotiates and reduces meanwhile;
* one *wait* node takes all the tokens and waits for the results; the optimizer's update
  consumes its outputs, so the waiting happens where the gradients are applied.

Every rank submits in the same order: `tf.function` runs stateful nodes (a `py_function` is
one) in the order they were created, and the submit nodes are created in backward order (the
last gradient first), so the order costs backward nothing: a submit waits only for its own
gradient and the submission before it. Nothing else changes: the same allreduces of the same
values and names as in one node, so the reduced gradients are the same (bit for bit with two
ranks, where a sum has one order; with more, a tensor that the engine fuses at another offset
may be summed in another order, as between any two runs whose fusion differs).

When: `HOROVOD_TF_OVERLAP_BACKWARD=1` always, `0` never (`Settings.tf_overlap_backward`); unset,
where a rank has two cores of its own or more (`cores_per_rank`), as the torch hooks decide.
Below two cores (2 ranks on this 2-core machine) Keras `fit` with one node was 7-26% faster than
overlapped in the quiet jobs of docs/engineering-notes.md (our reading, not profiled here:
the engine's work and the early submissions take the core from backward, as profiled for the
torch hooks). Eager code and TF1 sessions are as before: eagerly, backward has finished
before a gradient is seen; a session already submits without waiting (`_session_node`).
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from horovod.common import runtime
from horovod.common.cores import overlap_backward
from horovod.tensorflow._bridge import Job, in_function, per_job, refuse_xla, set_shapes


def enabled() -> bool:
    """True where gradients reduced now are submitted one node each: while a `tf.function` is
    traced, as `HOROVOD_TF_OVERLAP_BACKWARD` says, else where a rank has two cores or more."""
    if not in_function():
        return False
    settings = runtime.current().settings
    return overlap_backward(settings.tf_overlap_backward, settings.topology.local_size)


def run_in_backward_order(jobs: Sequence[Job], label: str) -> list[list[tf.Tensor]]:
    """`_bridge.run(jobs)` inside a `tf.function`, with one submit node per job (the last job's
    created first) and one wait node; `jobs` are in the order of the gradient list."""
    refuse_xla(label)
    step = _Submissions(jobs)
    tokens = [tf.py_function(partial(step.submit, k), jobs[k].inputs, Tout=tf.int64, name=f"{label}Submit")
              for k in reversed(range(len(jobs)))][::-1]
    dtypes = [d for job in jobs for d in job.dtypes]
    outputs = tf.py_function(step.wait, tokens, Tout=dtypes, name=f"{label}Wait")
    set_shapes(jobs, outputs)
    return per_job(jobs, outputs)


class _Submissions:
    """The submissions of one traced step between its submit nodes and its wait node.

    The graph owns this object (through its nodes), so nothing outlives the traced function. A
    step that fails after some submit nodes ran (an error in the rest of backward) never runs its
    wait node: its submissions stay here, one slot per job, and the next run of the step finds
    its first slot taken. It then waits for those leftovers before submitting again (the engine
    refuses a name still in flight) and drops their results. Where every rank failed at the same
    node, every rank submitted them, so they finish; a failure on some ranks only leaves the
    ranks out of step, as it would without overlap."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        self.jobs = list(jobs)
        self.waits: list[Callable[[], list[np.ndarray]] | None] = [None] * len(self.jobs)
        self.lock = threading.Lock()

    def submit(self, k: int, *tensors: tf.Tensor) -> np.int64:
        with self.lock:
            stale = [w for w in self.waits if w is not None] if self.waits[k] is not None else []
            if stale:
                self.waits = [None] * len(self.jobs)
        for wait in stale:  # a failed earlier run's results: nobody wants them
            wait()
        arrays = [np.asarray(t.numpy()) for t in tensors]
        with self.lock:
            self.waits[k] = self.jobs[k].start(arrays)
        return np.int64(k)

    def wait(self, *tokens: tf.Tensor) -> list[np.ndarray]:
        with self.lock:
            waits, self.waits = self.waits, [None] * len(self.jobs)
        # The node takes every token, so every slot is filled by now.
        return [out for wait in waits for out in wait()]  # type: ignore[misc]
