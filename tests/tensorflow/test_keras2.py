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

class CountEveryPass(K.callbacks.Callback):  # the reference's step stands for `passes` passes, each counted
    def __init__(self, passes):
        super().__init__()
        self.passes = passes

    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.iterations.assign_add(self.passes - 1)

def identity(make_opt, passes=1, batch=4):
    m = model()
    m.compile(optimizer=hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=passes,
                                                 average_aggregated_gradients=passes > 1), loss=LOSS)
    m.fit(mine(X, batch), mine(Y, batch), batch_size=batch, epochs=2, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ref = model()
    ref.compile(optimizer=make_opt(), loss=LOSS)
    ref.fit(X, Y, batch_size=passes * n * batch, epochs=2, shuffle=False, verbose=0,
            callbacks=[CountEveryPass(passes)] if passes > 1 else [])
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(m.get_weights(), ref.get_weights()))
    return [diff < 1e-4, int(m.optimizer.iterations.numpy())]

OPTIMIZERS = {"sgd": lambda: K.optimizers.SGD(0.1, momentum=0.9), "adam": lambda: K.optimizers.Adam(0.01)}
if LEGACY:
    OPTIMIZERS["legacy_adam"] = lambda: K.optimizers.legacy.Adam(lr=0.01)
    OPTIMIZERS["legacy_sgd"] = lambda: K.optimizers.legacy.SGD(0.1, momentum=0.9)

for name, make in OPTIMIZERS.items():
    check(f"identity_{name}")(lambda: identity(make))
    check(f"aggregated_{name}")(lambda: identity(make, passes=2))

# -- Horovod's own Keras tests (test_tensorflow2_keras.py), in its idiom -----------------------------
KINDS = ["legacy", "new"] if LEGACY else ["new"]

def testing_optimizer(kind):
    """Horovod's TestingOptimizer: adds the gradient to the variable."""
    if kind == "legacy":
        class TestingOptimizer(K.optimizers.legacy.Optimizer):
            def get_config(self):
                return super().get_config()

            def _create_slots(self, var_list):
                pass

            def _resource_apply_dense(self, grad, var, apply_state=None):
                return var.assign_add(grad)

        return TestingOptimizer("test")

    if LEGACY:  # tf_keras's new optimizers
        class TestingOptimizer(K.optimizers.Optimizer):
            def __init__(self, name="test", **kwargs):
                super().__init__(name=name, **kwargs)
                self._learning_rate = self._build_learning_rate(1.0)

            def update_step(self, gradient, variable):
                variable.assign_add(gradient)

        return TestingOptimizer()

    class TestingOptimizer(K.optimizers.Optimizer):  # Keras 3
        def update_step(self, gradient, variable, learning_rate):
            variable.assign_add(gradient)

    return TestingOptimizer(learning_rate=1.0, name="test")

def compute_and_apply(opt, loss, var_list):
    """One step as Horovod's tests take it: `_compute_gradients` then `apply_gradients` (Keras 3
    optimizers compute no gradients: a tape there)."""
    if hasattr(opt, "_compute_gradients"):
        grads_and_vars = opt._compute_gradients(loss, var_list=var_list)
        opt.apply_gradients(grads_and_vars, experimental_aggregate_gradients=False)
        return grads_and_vars
    flat = tf.nest.flatten(var_list)
    with tf.GradientTape() as tape:
        value = loss()
    grads_and_vars = list(zip(tape.gradient(value, flat), flat))
    opt.apply_gradients(grads_and_vars)
    return grads_and_vars

def aggregation_with_local_vars(kind, average):
    """test_gradient_aggregation_with_local_vars: 8 x and 8 y variables, the first 4 of each local."""
    passes = 4
    opt = hvd.DistributedOptimizer(optimizer=testing_optimizer(kind), backward_passes_per_step=passes,
                                   average_aggregated_gradients=average, sparse_as_dense=True)
    _ = opt.iterations
    total, num_local = 8, 4
    X = [tf.Variable([0.0]) for _ in range(total)]
    Y = [tf.Variable([1.0, 2.0]) for _ in range(total)]
    variables = [X, Y]
    for i in range(num_local):
        opt.register_local_var(X[i])
        opt.register_local_var(Y[i])

    def loss():
        return X - (float(r + 1) * tf.gather(Y, [0], axis=1))

    def expected(batch_id):
        steps = (batch_id + 1) // passes
        gx, mult = steps * 1.0, float(n + 1) / 2
        gy = steps * mult * -1.0
        if not average:
            gx, gy = gx * passes, gy * passes
        ex = [gx / n if i < num_local else gx for i in range(total)]
        ey = [1.0 + ((gy / mult) * float(r + 1)) / n if i < num_local else 1.0 + gy for i in range(total)]
        return np.reshape(ex, (-1, 1)), np.array([[a, 2.0] for a in ey])

    step = tf.function(lambda: compute_and_apply(opt, loss, variables))
    bad = []
    for idx in range(10):
        step()
        ex, ey = expected(idx)
        if not (np.allclose(np.array(X), ex) and np.allclose(np.array(Y), ey)
                and idx + 1 == int(opt.iterations.numpy())):
            bad.append([idx, np.array(X).ravel().tolist(), np.array(Y).tolist(), int(opt.iterations.numpy())])
    return {"bad": bad, "counter": int(opt._agg_helper.counter.numpy())}

def inf_gradient(kind):
    """test_grad_aggregation_with_inf_grad: an infinite first cycle leaves the second finite."""
    passes = 2
    step_count = tf.Variable(0, trainable=False, dtype=tf.int32)
    opt = K.optimizers.legacy.SGD() if kind == "legacy" else K.optimizers.SGD()
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=passes, sparse_as_dense=True)
    x = tf.Variable(0.)
    var = [x]

    def loss():
        step_count.assign_add(1)
        return tf.cond(pred=tf.greater(step_count, 1), true_fn=lambda: x, false_fn=lambda: x * float("inf"))

    for _ in range(2 * passes):
        grads_and_vars = compute_and_apply(opt, loss, var)
    return [bool(tf.math.is_finite(grads_and_vars[0][0])), float(grads_and_vars[0][0])]

def sparse_as_dense_aggregation(kind):
    """test_sparse_as_dense_with_grad_aggregation, plus the weights every rank ends with."""
    passes = 2
    opt = K.optimizers.legacy.RMSprop(lr=0.0001) if kind == "legacy" else K.optimizers.RMSprop(0.0001)
    opt = hvd.DistributedOptimizer(opt, sparse_as_dense=True, backward_passes_per_step=passes)
    K.utils.set_random_seed(5)
    model = K.models.Sequential([K.Input((10,), dtype="int32"), K.layers.Embedding(1000, 64)])
    model.compile(loss=K.losses.MeanSquaredError(), optimizer=opt)
    rng = np.random.default_rng(r)
    x, y = rng.integers(1000, size=(32, 10)), rng.random((32, 10, 64))
    steps = 3
    for _ in range(steps):
        model.train_on_batch(x, y)
    table = model.get_weights()[0]
    return [int(opt._agg_helper.counter.numpy()), steps % passes, float(np.abs(table).sum()),
            int(opt.iterations.numpy())]

for kind in KINDS:
    for average in (True, False):
        check(f"aggregation_{kind}_{average}")(lambda: aggregation_with_local_vars(kind, average))
    check(f"inf_gradient_{kind}")(lambda: inf_gradient(kind))
    check(f"sparse_aggregation_{kind}")(lambda: sparse_as_dense_aggregation(kind))

@check("sparse_aggregation_refused")
def _():
    opt = hvd.DistributedOptimizer(K.optimizers.SGD(0.1), backward_passes_per_step=2)
    table = tf.Variable(tf.ones((4, 2)))
    try:
        compute_and_apply(opt, lambda: tf.reduce_sum(tf.gather(table, [1])), [table])
    except ValueError as exc:
        return str(exc)
    return "no error"

if LEGACY:
    import horovod.keras as hvd_keras

    @check("partial_compute_gradients")
    def _():
        """test_partial_distributed_optimizer, for both kinds of tf_keras optimizer."""
        out = {}
        for kind in KINDS:
            for num_local_layers in range(3):
                model = K.models.Sequential()
                init = K.initializers.Constant(hvd.rank())
                model.add(K.layers.Dense(2, input_shape=(3,), kernel_initializer=init, bias_initializer=init))
                model.add(K.layers.RepeatVector(3))
                model.add(K.layers.TimeDistributed(K.layers.Dense(3, kernel_initializer=init,
                                                                  bias_initializer=init)))
                opt = K.optimizers.legacy.Adam() if kind == "legacy" else K.optimizers.Adam()
                model.compile(loss=K.losses.MSE, metrics=[K.metrics.categorical_accuracy])
                X, Y = np.random.random((1, 3)), np.random.random((1, 3, 3))
                with tf.GradientTape(persistent=True) as tape:
                    p = model(X, training=True)
                    l = model.loss(Y, p)
                gradients_tape = tape.gradient(l, model.trainable_weights)
                local_layers = model.layers[:num_local_layers]
                opt = hvd_keras.PartialDistributedOptimizer(opt, sparse_as_dense=True, local_layers=local_layers)
                pairs = opt._compute_gradients(l, model.trainable_weights, tape=tape)
                by_var = {v.ref(): g for g, v in pairs}
                local = {v.ref() for layer in local_layers for v in layer.trainable_weights}
                for var, grad in zip(model.trainable_weights, gradients_tape):
                    if var.ref() in local:  # local gradients only scaled by 1/size
                        good = np.allclose(grad, n * by_var[var.ref()])
                    else:  # reduced: the ranks started from different weights
                        good = not np.allclose(grad, by_var[var.ref()])
                    out.setdefault(f"{kind}_{num_local_layers}", []).append(good)
        return out

@check("elastic_state")
def _():
    """test_elastic_state, with TensorFlowKerasState and each kind of optimizer."""
    import horovod.tensorflow as hvd_tf
    out = {}
    for kind in KINDS:
        v = 1.0 if r == 0 else 2.0
        model1 = K.Sequential([K.layers.Dense(2, activation="softmax")])
        model1.build((2, 2))
        model1.set_weights([np.array([[v, v], [v, v]], dtype=np.float32), np.array([v, v], dtype=np.float32)])
        model2 = K.Sequential([K.layers.Dense(2, activation="softmax")])
        model2.build((2, 2))
        model2.set_weights([np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
                            np.array([0.0, 0.0], dtype=np.float32)])
        optimizer = (K.optimizers.legacy.Adam if kind == "legacy" else K.optimizers.Adam)(0.001 * n)
        state = hvd_tf.elastic.TensorFlowKerasState(model1, optimizer, batch=20 + r, epoch=10 + r)
        state.sync()
        model1_weights, model2_weights = model1.get_weights(), model2.get_weights()
        synced = all(np.allclose(w, np.ones_like(w)) for w in state.model.get_weights())
        steps = [synced, state.batch, state.epoch]
        model1.set_weights(model2_weights)
        state.batch, state.epoch = 21, 11
        state.restore()
        steps += [all(np.allclose(a, b) for a, b in zip(model1.get_weights(), model1_weights)), state.batch,
                  state.epoch]
        model1.set_weights(model2_weights)
        state.batch, state.epoch = 21, 11
        state.commit()
        state.restore()
        steps += [all(np.allclose(a, b) for a, b in zip(model1.get_weights(), model2_weights)), state.batch,
                  state.epoch]
        out[kind] = steps
    return out

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
            assert got == [True, 8], name  # every second pass applies; every pass counts, as in Horovod


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
        pytest.skip("Keras 3 refuses Keras 2's spellings (lr=, optimizers.legacy, ...): docs/tensorflow.md "
                    "lists the one-line change for each")
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


def kinds(run):
    return ["legacy", "new"] if run[0] == "tf_keras" else ["new"]


def test_aggregation_with_local_vars_matches_horovod(run):
    # Horovod's test_gradient_aggregation_with_local_vars: after each of 10 steps inside a
    # tf.function (4 passes each), x and y as its formula says, iterations = steps taken
    for kind in kinds(run):
        for average in (True, False):
            for got in both(run, f"aggregation_{kind}_{average}"):
                assert got == {"bad": [], "counter": 10 % 4}, (kind, average)


def test_infinite_gradient_is_cleared_after_its_cycle(run):
    # Keras 2: _compute_gradients returns the second cycle's reduced sum, 1 + 1 (not averaged);
    # Keras 3 optimizers compute no gradients, so the step's tape gradient (1) comes back
    expected = [True, 2.0] if run[0] == "tf_keras" else [True, 1.0]
    for kind in kinds(run):
        for got in both(run, f"inf_gradient_{kind}"):
            assert got == expected, kind


def test_sparse_as_dense_with_aggregation(run):
    for kind in kinds(run):
        zero, one = both(run, f"sparse_aggregation_{kind}")
        assert zero[:2] == [1, 1] and one[:2] == [1, 1], kind  # _agg_helper.counter == 3 % 2
        assert zero[2] == one[2], kind  # the embedding reduced: the same on every rank
        assert zero[3] == one[3] == 3, kind
    for got in both(run, "sparse_aggregation_refused"):  # as Horovod: sparse sums only with sparse_as_dense
        assert got.startswith("IndexedSlices are not supported when `backward_passes_per_step` > 1")


def test_partial_distributed_optimizer_compute_gradients(run):
    if run[0] != "tf_keras":
        pytest.skip("Keras 3 optimizers have no _compute_gradients: test_sparse_as_dense_and_local_layers covers "
                    "PartialDistributedOptimizer there")
    for got in both(run, "partial_compute_gradients"):
        assert set(got) == {f"{k}_{m}" for k in kinds(run) for m in range(3)}
        assert all(all(v) for v in got.values()), got


def test_elastic_state_with_keras_optimizers(run):
    for got in both(run, "elastic_state"):
        for kind in kinds(run):
            assert got[kind] == [True, 20, 10, True, 20, 10, True, 21, 11], kind
