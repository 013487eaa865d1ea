"""Gradients submitted while backward still runs inside a tf.function (horovod/tensorflow/backward_overlap.py),
on 2 real ranks: overlapped (HOROVOD_TF_OVERLAP_BACKWARD=1; unset, this 2-core machine would not
overlap) the reduced results are bit for bit those of one node per step (=0), and the late layers'
allreduces reach the engine before backward has reached the first layer."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import ok, results, run_tf  # noqa: E402

SNIPPET = r'''
import json
import time
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras

TIMELINE = os.environ["HOROVOD_TIMELINE"]
rng = np.random.default_rng(0)
X = rng.normal(size=(32, 6)).astype("float32")
Y = (X @ rng.normal(size=(6, 3))).argmax(axis=1).astype("int32")
IDS = rng.integers(0, 10, size=(32, 4)).astype("int32")
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
seen_late_submits = []  # rank 0, first step: were the last layer's allreduces submitted mid-backward?


def submitted_by_rank0():
    """Names of the tensors whose request from rank 0 the timeline records (rank 0 writes it; an
    `X` event named after a rank marks that rank's request arriving at the coordinator)."""
    with open(TIMELINE) as f:
        events = json.load(f)  # the file stays valid JSON between writes
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    return {names.get(e["pid"]) for e in events if e.get("ph") == "X" and e.get("name") == "0"}


def late_submits_seen(dy):
    """Backward between the first and the second layer. On rank 0's first step, wait (bounded) until
    the timeline shows rank 0's own requests for the last layer's gradients: the first layer's
    gradient, and so the end of backward, cannot come before this returns, so seeing them proves
    they were submitted while backward ran."""
    if hvd.rank() == 0 and not seen_late_submits:
        late = {"allreduce.DistributedSGD.4of6", "allreduce.DistributedSGD.5of6"}
        deadline = time.monotonic() + 60
        while not late <= submitted_by_rank0() and time.monotonic() < deadline:
            time.sleep(0.02)
        seen_late_submits.append(late <= submitted_by_rank0())
    return dy


@tf.custom_gradient
def marked(x):
    # stateful=False: a stateful node would be ordered before the submit nodes created after it
    return tf.identity(x), lambda dy: tf.numpy_function(late_submits_seen, [dy], dy.dtype, stateful=False)


class Marked(keras.Model):
    def __init__(self):
        super().__init__()
        self.first, self.second, self.last = (keras.layers.Dense(8, activation="tanh"),
                                              keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3))

    def call(self, x):
        return self.last(self.second(marked(self.first(x))))


def mine(a, batch=4):  # this rank's rows of every global batch
    r, n = hvd.rank(), hvd.size()
    return np.concatenate([a[s + r * batch:s + (r + 1) * batch] for s in range(0, len(a), n * batch)])


def fit_weights():
    keras.utils.set_random_seed(3)
    model = Marked()
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)), loss=LOSS)
    model.fit(mine(X), mine(Y), batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0)])
    return [w.tolist() for w in model.get_weights()]


def tape_weights():
    """A custom tf.function step: embedding (IndexedSlices gradients), two gradient groups."""
    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(10, 5), keras.layers.Flatten(),
                              keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3)])
    opt = keras.optimizers.Adam(0.01)
    ids, y = mine(IDS), mine(Y)

    @tf.function
    def step(ids, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(ids))
        tape = hvd.DistributedGradientTape(tape, groups=2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)

    for i in range(0, len(ids), 4):
        step(ids[i:i + 4], y[i:i + 4])
    nodes = [op.type for op in step.get_concrete_function(ids[:4], y[:4]).graph.get_operations()]
    return [w.tolist() for w in model.get_weights()], nodes.count("EagerPyFunc")


hvd.init()
overlapped = {"fit": fit_weights(), "tape": tape_weights()}
hvd.shutdown()
os.environ["HOROVOD_TF_OVERLAP_BACKWARD"] = "0"
hvd.init()
one_node = {"fit": fit_weights(), "tape": tape_weights()}

@check("identical")
def _():
    return [overlapped["fit"] == one_node["fit"], overlapped["tape"][0] == one_node["tape"][0]]

@check("nodes")
def _():
    # overlapped: 2 allreduce groups + 2 allgathers (embedding values, indices) + 1 wait; else one node
    return [overlapped["tape"][1], one_node["tape"][1]]

@check("late_submits_seen")
def _():
    return seen_late_submits[:1]
'''


def test_overlapped_gradients_are_identical_and_submitted_during_backward(tmp_path):
    timeline = tmp_path / "timeline.json"
    run = run_tf(SNIPPET, env={"HOROVOD_TIMELINE": str(timeline), "HOROVOD_TF_OVERLAP_BACKWARD": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for rank in (0, 1):
        got = results(run, rank)
        assert ok(got["identical"]) == [True, True]
        assert ok(got["nodes"]) == [5, 1]
    assert ok(results(run, 0)["late_submits_seen"]) == [True]


FAILED_STEP = r'''
import json
import time
import horovod.tensorflow as hvd

hvd.init()
r = hvd.rank()
TIMELINE = os.environ["HOROVOD_TIMELINE"]
rng = np.random.default_rng(r)
X, Y = rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 2)).astype("float32")
w1 = tf.Variable(np.ones((3, 5), "float32") * 0.1)
w2 = tf.Variable(np.ones((5, 2), "float32") * 0.2)
failing = tf.Variable(False)

def requested(rank):
    """Tensor names whose request from `rank` rank 0's timeline records (every rank reads the file;
    one that reads while rank 0 writes tries again later)."""
    try:
        with open(TIMELINE) as f:
            events = json.load(f)
    except (OSError, ValueError):
        return set()
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    return {names.get(e["pid"]) for e in events if e.get("ph") == "X" and e.get("name") == str(rank)}

def late_start(x, fail):
    # Rank 1 starts the failing step late, so rank 0 is back with its next step while the
    # allreduce it submitted in the failing one still waits for rank 1.
    if fail and r == 1:
        time.sleep(1)
    return x

def first_layer_backward(dy, fail):
    """Fail (on purpose) once this rank's request for w2's gradient, which backward produced
    first, has reached the coordinator: the step dies between its submit nodes and its wait node."""
    if fail:
        deadline = time.monotonic() + 60
        while not any(name and "1of2" in name for name in requested(r)) and time.monotonic() < deadline:
            time.sleep(0.02)
        raise ValueError("injected failure in backward")
    return dy

@tf.custom_gradient
def guarded(h):
    return tf.identity(h), lambda dy: tf.numpy_function(first_layer_backward, [dy, failing], dy.dtype, stateful=False)

@tf.function
def step(x, y):
    x = tf.numpy_function(late_start, [x, failing], x.dtype, stateful=False)
    x.set_shape((4, 3))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.tanh(guarded(x @ w1)) @ w2 - y) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    return tape.gradient(loss, [w1, w2])

failing.assign(True)
try:
    step(X, Y)
    failed = "no error"
except tf.errors.OpError as exc:
    failed = "injected failure" in str(exc)
failing.assign(False)

@check("good_step")
def _():
    return [g.numpy() for g in step(X, Y)]

@check("failed")
def _():
    return failed

@check("local")
def _():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.tanh(X @ w1) @ w2 - Y) ** 2)
    return [g.numpy() for g in tape.gradient(loss, [w1, w2])]
'''


def test_a_step_failed_mid_backward_leaves_the_next_step_working(tmp_path):
    timeline = tmp_path / "timeline.json"
    run = run_tf(FAILED_STEP, env={"HOROVOD_TIMELINE": str(timeline), "HOROVOD_TF_OVERLAP_BACKWARD": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = [results(run, rank) for rank in (0, 1)]
    for rank in (0, 1):
        assert ok(got[rank]["failed"]) is True
        # the good step's gradients are the average of both ranks' own gradients
        for reduced, a, b in zip(ok(got[rank]["good_step"]), ok(got[0]["local"]), ok(got[1]["local"])):
            np.testing.assert_allclose(reduced, (np.asarray(a) + np.asarray(b)) / 2, rtol=1e-6, atol=1e-7)
