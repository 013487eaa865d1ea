"""Run a TensorFlow / Keras snippet on 2 ranks through horovodrun, with a quiet, single-threaded TF.

Inside the snippet, `check(label)` decorates a function that is run at once: its return value
(or the exception, as "ERROR <type>: <message>") is stored under `label` and reported at the
end by `done()`, so one failing check does not hide the others. `modes(fn)` runs `fn` eagerly
and as a `tf.function`, returning {"eager": ..., "graph": ...}.
"""

from __future__ import annotations

import textwrap

from multirank import RunResult, hvdrun

# Quiet TensorFlow, no GPU probing, and one compute thread per rank for XLA (jax) and torch: the
# ranks share the machine's cores.
ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "CUDA_VISIBLE_DEVICES": "",
       "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", "OMP_NUM_THREADS": "1"}

PRELUDE = '''
import os
import numpy as np
import keras
RESULTS = {}

def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "numpy") and callable(value.numpy):
        value = value.numpy()
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return value.decode() if isinstance(value, bytes) else value

def check(label):
    def run(fn):
        try:
            RESULTS[label] = _plain(fn())
        except Exception as exc:  # reported, asserted by the test
            RESULTS[label] = f"ERROR {type(exc).__name__}: {str(exc)[:400]}"
        return fn
    return run

def done():
    report(**RESULTS)

if keras.backend.backend() == "torch":
    import torch
    torch.set_num_threads(1)
if keras.backend.backend() == "tensorflow":
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

    def modes(fn):
        return {"eager": fn(), "graph": tf.function(fn)()}
'''


# Data, sharding, a model factory and the fit-vs-single-process comparison, for any Keras backend.
IDENTITY_HELPERS = r'''
def dataset(n=64, features=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x @ rng.normal(size=(features, classes))).argmax(axis=1).astype("int32")
    return x, y

def shard(array, rank, size, batch):
    """Rank `rank`'s part of every global batch of size*batch rows, in step order."""
    rows = [array[start + rank * batch:start + (rank + 1) * batch]
            for start in range(0, len(array), size * batch)]
    return np.concatenate(rows)

def make_model(norm=None, seed=3):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((6,)), keras.layers.Dense(16, activation="tanh")]
    if norm is not None:
        layers.append(norm())
    layers += [keras.layers.Dense(3)]
    return keras.Sequential(layers)

def max_diff(a_weights, b_weights):
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(a_weights, b_weights))

class CountEveryPass(keras.callbacks.Callback):
    """For a one-process reference of backward_passes_per_step=k: each of its steps stands for k
    passes, and Horovod counts every pass in `iterations` (Adam's bias correction reads it), so
    the k - 1 passes that apply nothing are counted before the step."""

    def __init__(self, passes):
        super().__init__()
        self.passes = passes

    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.iterations.assign_add(self.passes - 1)

def fit_identity(hvd, norm=None, ref_norm=None, optimizer=lambda: keras.optimizers.Adam(0.01), batch=4, epochs=3,
                 passes=1, **options):
    """Train on this rank's shards with hvd.DistributedOptimizer, and one local reference model
    on the whole batches (passes * size * batch rows a step); compare."""
    r, n = hvd.rank(), hvd.size()
    x, y = dataset()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = make_model(norm)
    wrapped = hvd.DistributedOptimizer(optimizer(), backward_passes_per_step=passes,
                                       average_aggregated_gradients=passes > 1, **options)
    model.compile(optimizer=wrapped, loss=loss)
    hist = model.fit(shard(x, r, n, batch), shard(y, r, n, batch), batch_size=batch, epochs=epochs, shuffle=False,
                     verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           hvd.callbacks.MetricAverageCallback()])
    reference = make_model(ref_norm or norm)
    reference.compile(optimizer=optimizer(), loss=loss)
    ref_hist = reference.fit(x, y, batch_size=passes * n * batch, epochs=epochs, shuffle=False, verbose=0,
                             callbacks=[CountEveryPass(passes)] if passes > 1 else [])
    return {"weights": max_diff(model.get_weights(), reference.get_weights()),
            "loss": max(abs(a - b) for a, b in zip(hist.history["loss"], ref_hist.history["loss"])),
            "loss_drops": hist.history["loss"][-1] < hist.history["loss"][0],
            "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations))}
'''


def run_tf(code: str, backend: str = "tensorflow", timeout: float = 240.0, np: int = 2,
           env: dict[str, str] | None = None) -> RunResult:
    """Run `code` (after the prelude) on `np` ranks with the given Keras backend (and `env`)."""
    env = dict(ENV, KERAS_BACKEND=backend, **(env or {}))
    return hvdrun(PRELUDE + textwrap.dedent(code) + "\ndone()\n", np=np, env=env, timeout=timeout)


def results(run: RunResult, rank: int) -> dict:
    assert rank in run.ranks, f"rank {rank} reported nothing:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    return run.ranks[rank]


def ok(value: object) -> object:
    """The value of a check, failing the test with its error message if it raised."""
    assert not (isinstance(value, str) and value.startswith("ERROR")), value
    return value
