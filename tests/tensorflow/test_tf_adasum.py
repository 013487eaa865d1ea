"""op=Adasum on TensorFlow: DistributedGradientTape (eager and tf.function) and the Keras
DistributedOptimizer reduce each gradient with the Adasum formula, on 2 ranks."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import ok, results, run_tf  # noqa: E402

SNIPPET = r'''
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvd_keras
from tests.support.adasum_reference import adasum

hvd.init()
r, n = hvd.rank(), hvd.size()
keras.utils.set_random_seed(3)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
rng = np.random.default_rng(r)
x, y = rng.normal(size=(8, 6)).astype("float32"), rng.normal(size=(8, 4)).astype("float32")

def loss_of(tape):
    with tape:
        return tf.reduce_mean(tf.square(model(x) - y))

def expected():
    """Every rank's local gradients, gathered, combined by the formula tensor by tensor."""
    tape = tf.GradientTape()
    local = tape.gradient(loss_of(tape), model.trainable_variables)
    out = []
    for g in local:
        every = hvd.allgather(g[None]).numpy()
        out.append(adasum([e.reshape(-1) for e in every], [(0, g.numpy().size)]).reshape(g.shape))
    return out

WANT = expected()

def tape_grads():
    tape = tf.GradientTape()
    loss = loss_of(tape)
    return hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, model.trainable_variables)

@check("tape")
def _():
    got = modes(tape_grads)
    return {mode: max(float(np.max(np.abs(a.numpy() - b))) for a, b in zip(grads, WANT)) for mode, grads in got.items()}

@check("keras")
def _():
    before = [w.copy() for w in model.get_weights()]
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Adasum), loss="mse")
    model.train_on_batch(x, y)
    steps = [b - a for a, b in zip(model.get_weights(), before)]  # lr 1: the step is the reduced gradient
    return max(float(np.max(np.abs(s - w))) for s, w in zip(steps, WANT))
'''


@pytest.fixture(scope="module")
def run():
    return run_tf(SNIPPET)


@pytest.mark.parametrize("rank", [0, 1])
def test_tape_and_keras_optimizer_reduce_with_the_formula(run, rank):
    values = results(run, rank)
    assert max(ok(values["tape"]).values()) < 1e-6, values
    assert ok(values["keras"]) < 1e-6, values
