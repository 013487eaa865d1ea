"""horovod.tensorflow.keras with Keras 2 scripts: the same training checks under Keras 3 (`tf.keras`
is Keras 3) and under tf_keras (`TF_USE_LEGACY_KERAS=1`), on 2 real ranks: DistributedOptimizer
(legacy optimizers, `lr=`, configs, backward_passes_per_step, sparse_as_dense, partial), every
callback, and load_model."""

import importlib.util

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import ok, results, run_tf  # noqa: E402

SNIPPET = r'''
import tempfile
import horovod.tensorflow.keras as hvd
K = tf.keras
LEGACY = K.__name__.startswith("tf_keras")
hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(0)
X = rng.normal(size=(32, 6)).astype("float32")
Y = (X @ rng.normal(size=(6, 3))).argmax(axis=1).astype("int32")
LOSS = K.losses.SparseCategoricalCrossentropy(from_logits=True)

def model(seed=3):
    K.utils.set_random_seed(seed)
    return K.Sequential([K.Input((6,)), K.layers.Dense(8, activation="tanh"), K.layers.Dense(3)])

def mine(a, batch):  # this rank's rows of every global batch
    return np.concatenate([a[s + r * batch:s + (r + 1) * batch] for s in range(0, len(a), n * batch)])

def identity(make_opt, passes=1, batch=4):
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=passes,
                                                 average_aggregated_gradients=passes > 1), loss=LOSS)
    m.fit(mine(X, batch), mine(Y, batch), batch_size=batch, epochs=2, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ref = model()
    ref.compile(optimizer=make_opt(), loss=LOSS)
    ref.fit(X, Y, batch_size=passes * n * batch, epochs=2, shuffle=False, verbose=0)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(m.get_weights(), ref.get_weights()))
    return [diff < 1e-4, int(m.optimizer.iterations.numpy())]

OPTIMIZERS = {"sgd": lambda: K.optimizers.SGD(0.1, momentum=0.9), "adam": lambda: K.optimizers.Adam(0.01)}
if LEGACY:
    OPTIMIZERS["legacy_adam"] = lambda: K.optimizers.legacy.Adam(lr=0.01)
    OPTIMIZERS["legacy_sgd"] = lambda: K.optimizers.legacy.SGD(0.1, momentum=0.9)

for name, make in OPTIMIZERS.items():
    check(f"identity_{name}")(lambda: identity(make))
    check(f"aggregated_{name}")(lambda: identity(make, passes=2))

@check("config")
def _():
    opt = hvd.DistributedOptimizer(K.optimizers.Adam(0.02))
    again = type(opt).from_config(opt.get_config())
    return [type(again).__name__, float(opt.learning_rate.numpy()), float(again.learning_rate.numpy())]

@check("custom_loop")
def _():
    import horovod.tensorflow as hvd_tf
    opt = hvd_tf.DistributedOptimizer(K.optimizers.SGD(0.1))
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * (r + 1.0))
    opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))  # a tape's gradients: reduced on apply
    return w.numpy().tolist()

@check("callbacks")
def _():
    m = model(seed=r)  # every rank starts elsewhere: the broadcast makes them equal
    m.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(0.1, momentum=0.9)), loss=LOSS)
    hist = m.fit(X[r::n], Y[r::n], batch_size=4, epochs=2, verbose=0, shuffle=False, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1, steps_per_epoch=4)])
    return {"weights": [w.tolist() for w in m.get_weights()], "loss": hist.history["loss"],
            "lr": [float(v) for v in hist.history["lr"]]}

@check("best_and_schedule")
def _():
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.SGD(0.1)), loss=LOSS)
    folder = tempfile.mkdtemp()
    best = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    best.filepath = folder + "/best.keras"
    schedule = hvd.callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5)
    hist = m.fit(X[r::n], Y[r::n], batch_size=4, epochs=2, verbose=0, callbacks=[best, schedule])
    return [sorted(os.listdir(folder)), hist.history["lr"]]

@check("sparse_partial")
def _():
    K.utils.set_random_seed(1)
    m = K.Sequential([K.Input((2,), dtype="int32"), K.layers.Embedding(10, 3), K.layers.Flatten(), K.layers.Dense(2)])
    opt = hvd.PartialDistributedOptimizer(K.optimizers.SGD(0.1), local_layers=[m.layers[-1]], sparse_as_dense=True)
    m.compile(optimizer=opt, loss=LOSS)
    ids = (np.arange(16).reshape(8, 2) + r) % 10
    m.fit(ids, (ids[:, 0] + r) % 2, batch_size=4, epochs=1, verbose=0)
    return [w.tolist() for w in m.get_weights()]

if LEGACY:
    @check("keras2_script")
    def _():
        """A Horovod-era Keras 2 script's idioms, unchanged."""
        m = model()
        opt = hvd.DistributedOptimizer(K.optimizers.legacy.SGD(lr=0.01 * hvd.size(), momentum=0.9))
        m.compile(loss=LOSS, optimizer=opt, metrics=["accuracy"], experimental_run_tf_function=False)
        folder = tempfile.mkdtemp()
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                     hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvd.size(), warmup_epochs=1,
                                                              verbose=1)]
        if r == 0:
            callbacks.append(K.callbacks.ModelCheckpoint(folder + "/checkpoint-{epoch}.h5"))
        hist = m.fit(X[r::n], Y[r::n], batch_size=4, epochs=2, verbose=1 if r == 0 else 0, callbacks=callbacks)
        return [len(opt.variables()), float(K.backend.get_value(opt.lr)), sorted(os.listdir(folder)),
                hist.history["accuracy"]]

@check("load_model")
def _():
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(K.optimizers.Adam(0.01)), loss=LOSS)
    m.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    path = tempfile.mkdtemp() + ("/model.h5" if LEGACY else "/model.keras")
    m.save(path)
    loaded = hvd.load_model(path)
    before = int(loaded.optimizer.iterations.numpy())
    loaded.fit(X[r::n], Y[r::n], batch_size=4, epochs=1, verbose=0)
    distributed = hasattr(loaded.optimizer, "_hvd_reducer") or isinstance(loaded.optimizer, hvd.DistributedOptimizer)
    return {"distributed": distributed, "kept_state": before, "weights": [w.tolist() for w in loaded.get_weights()]}
'''


def keras_run(flavour):
    if flavour == "tf_keras":
        assert importlib.util.find_spec("tf_keras"), "tf_keras is not installed: bash scripts/setup-venv.sh installs it"
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else {}
    return run_tf(SNIPPET, np=2, timeout=240, env=env)


@pytest.fixture(scope="module", params=["keras3", "tf_keras"])
def run(request):
    return request.param, keras_run(request.param)


def both(run, key):
    return [ok(results(run[1], rank)[key]) for rank in (0, 1)]


def test_job_succeeded(run):
    run[1].check()


def test_training_matches_one_process(run):
    names = ["sgd", "adam"] + (["legacy_adam", "legacy_sgd"] if run[0] == "tf_keras" else [])
    for name in names:
        for got in both(run, f"identity_{name}"):
            assert got == [True, 8], name  # 2 epochs x 4 steps
        for got in both(run, f"aggregated_{name}"):
            assert got == [True, 4], name  # every second pass applies


def test_optimizer_config_round_trips(run):
    for got in both(run, "config"):
        # The wrapped optimizer's class name and config, as Horovod's (Keras 2: a subclass of it;
        # Keras 3: a wrapper class carrying its name)
        assert got[0] == "Adam"
        assert got[1:] == pytest.approx([0.02, 0.02])


def test_custom_loop_through_horovod_tensorflow(run):
    for got in both(run, "custom_loop"):
        assert got == pytest.approx([1.0 - 0.15, 2.0 - 0.15])  # the gradient averaged: (1 + 2) / 2


def test_callbacks(run):
    zero, one = both(run, "callbacks")
    assert zero["weights"] == one["weights"]
    assert zero["loss"] == one["loss"]  # averaged over the ranks
    # warmup over epoch 0 (4 steps): at its last step 0.1 * (0.75 * (2 - 1) + 1) / 2, then unchanged
    assert zero["lr"] == one["lr"] == pytest.approx([0.0875, 0.0875])


def test_best_checkpoint_and_schedule(run):
    for got in both(run, "best_and_schedule"):
        assert got[0] == ["best.keras"]
        assert got[1] == pytest.approx([0.1, 0.05])  # 0.1 * 0.5 ** epoch


def test_sparse_as_dense_and_local_layers(run):
    zero, one = both(run, "sparse_partial")
    assert zero[0] == one[0]  # the embedding is reduced
    assert zero[-1] != one[-1]  # the local layer is not


def test_keras2_script_idioms(run):
    if run[0] != "tf_keras":
        return  # Keras 3 refuses these spellings: docs/tensorflow.md lists the one-line changes
    zero, one = both(run, "keras2_script")
    assert zero[0] == one[0] == 5  # opt.variables(), called: iterations and a momentum slot per weight
    assert zero[1] == one[1]
    assert zero[2] == ["checkpoint-1.h5", "checkpoint-2.h5"] and one[2] == []
    assert zero[3] == one[3]  # averaged


def test_load_model_keeps_state_and_distributes(run):
    zero, one = both(run, "load_model")
    assert zero["distributed"] and one["distributed"]
    assert zero["kept_state"] == one["kept_state"] == 4
    assert zero["weights"] == one["weights"]
