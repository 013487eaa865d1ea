"""The data-parallel identity on TensorFlow: 2 ranks training on their halves of every global
batch end with exactly the weights of one process training on the whole batches.

Checked for a custom tf.function GradientTape loop (DistributedGradientTape), Keras `model.fit`
with DistributedOptimizer (and MetricAverageCallback), and SyncBatchNormalization."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import IDENTITY_HELPERS, ok, results, run_tf  # noqa: E402

SNIPPET = IDENTITY_HELPERS + r'''
import horovod.tensorflow.keras as hvd_keras
import horovod.tensorflow as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()

@check("tape_loop")
def _():
    x, y = dataset()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model, reference = make_model(), make_model()
    opt, ref_opt = keras.optimizers.SGD(0.1, momentum=0.9), keras.optimizers.SGD(0.1, momentum=0.9)

    @tf.function
    def step(xb, yb, first):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first:
            hvd.broadcast_variables(model.variables + opt.variables, root_rank=0)
        return loss

    @tf.function
    def ref_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, reference(xb, training=True))
        grads = tape.gradient(loss, reference.trainable_variables)
        ref_opt.apply_gradients(zip(grads, reference.trainable_variables))

    batch = 4
    xs, ys = shard(x, r, n, batch), shard(y, r, n, batch)
    for s in range(len(x) // (n * batch)):
        step(xs[s * batch:(s + 1) * batch], ys[s * batch:(s + 1) * batch], s == 0)
        ref_step(x[s * n * batch:(s + 1) * n * batch], y[s * n * batch:(s + 1) * n * batch])
    return max_diff(model.get_weights(), reference.get_weights())

@check("fit")
def _():
    return fit_identity(hvd_keras)

@check("fit_sync_batch_norm")
def _():
    return fit_identity(hvd_keras, norm=hvd.SyncBatchNormalization, ref_norm=keras.layers.BatchNormalization,
                        optimizer=lambda: keras.optimizers.SGD(0.05, momentum=0.9))

@check("sync_batch_norm_eager")
def _():
    x = np.arange(12, dtype="float32").reshape(6, 2)
    layer, plain = hvd.SyncBatchNormalization(momentum=0.5), keras.layers.BatchNormalization(momentum=0.5)
    mine = layer(x[r * 3:(r + 1) * 3], training=True)
    whole = plain(x, training=True)
    return [float(np.max(np.abs(mine.numpy() - whole.numpy()[r * 3:(r + 1) * 3]))),
            float(np.max(np.abs(layer.moving_variance.numpy() - plain.moving_variance.numpy())))]
'''


@pytest.fixture(scope="module")
def run():
    return run_tf(SNIPPET)


def test_job_succeeded(run):
    run.check()


def test_gradient_tape_loop_matches_single_process(run):
    for rank in (0, 1):
        assert ok(results(run, rank)["tape_loop"]) < 1e-5


def test_model_fit_matches_single_process(run):
    for rank in (0, 1):
        got = ok(results(run, rank)["fit"])
        assert got["weights"] < 1e-5 and got["loss"] < 1e-5 and got["loss_drops"]
        assert got["iterations"] == 3 * 64 // 8


def test_sync_batch_norm_fit_matches_single_process_batch_norm(run):
    for rank in (0, 1):
        got = ok(results(run, rank)["fit_sync_batch_norm"])
        assert got["weights"] < 1e-4 and got["loss"] < 1e-5


def test_sync_batch_norm_statistics(run):
    for rank in (0, 1):
        out_diff, moving_var_diff = ok(results(run, rank)["sync_batch_norm_eager"])
        assert out_diff < 1e-5 and moving_var_diff < 1e-4
