"""horovod.keras on Keras 3's torch and jax backends (Horovod itself only ever ran on TensorFlow):
the data-parallel identity with model.fit, the callbacks and value functions, on 2 ranks.

Each backend's test is skipped, with the reason, when that framework is not installed."""

import importlib.util

import pytest

pytest.importorskip("keras")

from tfrun import IDENTITY_HELPERS, ok, results, run_tf  # noqa: E402

SNIPPET = IDENTITY_HELPERS + r'''
import horovod.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()

@check("backend")
def _():
    return keras.backend.backend()

@check("fit")
def _():
    return fit_identity(hvd)

@check("fit_sgd_momentum_fp16")
def _():
    return fit_identity(hvd, optimizer=lambda: keras.optimizers.SGD(0.05, momentum=0.9),
                        compression=hvd.Compression.fp16, epochs=2)

@check("passes_per_step")
def _():
    return fit_identity(hvd, passes=2, epochs=1)

@check("passes_per_step_without_jit")
def _():
    x, y = dataset()
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                                     average_aggregated_gradients=True),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)
    model.fit(shard(x, r, n, 4), shard(y, r, n, 4), batch_size=4, epochs=1, shuffle=False, verbose=0)
    reference = make_model()
    reference.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    return max_diff(model.get_weights(), reference.get_weights())

@check("warmup_and_average")
def _():
    x, y = dataset()
    lrs = []
    record = keras.callbacks.LambdaCallback(
        on_batch_begin=lambda b, logs: lrs.append(float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))))
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(shard(x, r, n, 8), shard(y, r, n, 8), batch_size=8, epochs=2, shuffle=False, verbose=0,
                     callbacks=[hvd.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=2), record,
                                hvd.callbacks.MetricAverageCallback()])
    return [lrs, hist.history["loss"]]

@check("values")
def _():
    return [hvd.allreduce(keras.ops.ones(2) * (r + 1)), hvd.allgather(np.full((1, 2), r)),
            hvd.broadcast(keras.ops.ones(1) * r, 1), hvd.reducescatter(np.ones((2, 1)) * (r + 1), op=hvd.Sum)]

@check("tf_keras_refuses")
def _():
    try:
        import horovod.tensorflow.keras  # noqa: F401
        return "imported"
    except ImportError as exc:
        return str(exc)
'''


def _backend_run(backend, package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"the Keras {backend} backend needs {package}, which is not installed")
    return run_tf(SNIPPET, backend=backend)


@pytest.fixture(scope="module", params=[("torch", "torch"), ("jax", "jax")], ids=["torch", "jax"])
def run(request):
    backend, package = request.param
    result = _backend_run(backend, package)
    result.backend = backend
    return result


def both(run, key):
    return [ok(results(run, rank)[key]) for rank in (0, 1)]


def test_runs_on_that_backend(run):
    run.check()
    assert both(run, "backend") == [run.backend] * 2


def test_model_fit_matches_single_process(run):
    for got in both(run, "fit") + both(run, "fit_sgd_momentum_fp16"):
        assert got["weights"] < 1e-2 and got["loss_drops"]
    for got in both(run, "fit"):
        assert got["weights"] < 1e-5 and got["loss"] < 1e-5


def test_backward_passes_per_step(run):
    without_jit = both(run, "passes_per_step_without_jit")
    assert max(without_jit) < 1e-5
    for rank in (0, 1):
        jitted = results(run, rank)["passes_per_step"]
        if run.backend == "jax":  # jax.jit (Keras' default there) cannot hold the aggregation branch
            assert jitted.startswith("ERROR NotImplementedError") and "jit_compile=False" in jitted
        else:
            assert ok(jitted)["weights"] < 1e-5


def test_callbacks(run):
    (lrs0, loss0), (lrs1, loss1) = both(run, "warmup_and_average")
    assert lrs0 == lrs1 == pytest.approx([0.4 / 2 * (1 + (e + b / 4) / 2) for e in range(2) for b in range(4)])
    assert loss0 == loss1


def test_value_functions(run):
    for rank, got in enumerate(both(run, "values")):
        assert got == [[1.5, 1.5], [[0, 0], [1, 1]], [1.0], [[3.0]]]


def test_tensorflow_keras_needs_the_tensorflow_backend(run):
    for message in both(run, "tf_keras_refuses"):
        assert "KERAS_BACKEND" in message and "horovod.keras" in message
