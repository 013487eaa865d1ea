"""horovod.tensorflow.keras / horovod.keras on the TensorFlow backend: the optimizer wrapper,
callbacks, load_model and value functions, on 2 real ranks (one horovodrun job)."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import IDENTITY_HELPERS, ok, results, run_tf  # noqa: E402

SNIPPET = IDENTITY_HELPERS + r'''
import tempfile
import horovod.keras as hvd_any
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
x, y = dataset()
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Record(keras.callbacks.Callback):
    """Records the learning rate, the first momentum buffer and the logs as training goes."""

    def __init__(self):
        super().__init__()
        self.lr, self.momentum, self.epoch_logs = [], [], []

    def _momentum(self):
        buffers = getattr(self.model.optimizer, "momentums", None)  # None until the first step built them
        self.momentum.append(float(np.sum(keras.ops.convert_to_numpy(buffers[0]))) if buffers else None)

    def on_batch_begin(self, batch, logs=None):
        self.lr.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))
        self._momentum()

    def on_batch_end(self, batch, logs=None):
        self._momentum()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def trained(callbacks, optimizer=None, epochs=3, batch=8, seed=3, data=None):
    model = make_model(seed=seed)
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer or keras.optimizers.SGD(0.1)), loss=loss)
    xs, ys = data or (shard(x, r, n, batch), shard(y, r, n, batch))
    model.fit(xs, ys, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    return model

@check("schedule_staircase")
def _():
    rec = Record()
    trained([hvd.callbacks.LearningRateScheduleCallback(0.2, multiplier=0.5, start_epoch=1, end_epoch=3), rec],
            epochs=4)
    return [rec.lr[::4], [logs["lr"] for logs in rec.epoch_logs]]

@check("schedule_smooth")
def _():
    rec = Record()
    trained([hvd.callbacks.LearningRateScheduleCallback(1.0, multiplier=lambda e: 1.0 / (1.0 + e), staircase=False),
             rec], epochs=2)
    return rec.lr

@check("momentum_correction")
def _():
    rec = Record()
    trained([hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=lambda e: 0.1 if e >= 1 else 1.0), rec],
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9), epochs=2)
    # momentum sums: begin/end per batch, 4 batches an epoch: the end of epoch 0's last batch, then
    # the beginning of epoch 1's first batch (after the schedule callback ran)
    return [rec.momentum[7], rec.momentum[8], rec.lr[3], rec.lr[4]]

@check("warmup")
def _():
    import contextlib, io
    rec, out = Record(), io.StringIO()
    with contextlib.redirect_stdout(out):
        trained([hvd.callbacks.LearningRateWarmupCallback(0.4, warmup_epochs=2, verbose=1), rec], epochs=3)
    return [rec.lr, "warmup" in out.getvalue()]

@check("metric_average")
def _():
    raw, averaged = Record(), Record()
    trained([raw, hvd.callbacks.MetricAverageCallback(), averaged], epochs=2)
    return [[logs["loss"] for logs in raw.epoch_logs], [logs["loss"] for logs in averaged.epoch_logs]]

@check("broadcast_callback")
def _():
    model = make_model(seed=10 + r)  # different initial weights on each rank
    local = model.layers[-1].kernel
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss=loss)
    model.fit(shard(x, r, n, 8), shard(y, r, n, 8), batch_size=8, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local])])
    return [float(np.sum(model.layers[0].kernel.numpy())), float(np.sum(local.numpy())),
            float(np.sum(model.optimizer.variables[2].numpy()))]

@check("best_checkpoint")
def _():
    folder = tempfile.mkdtemp()
    unset = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    try:
        trained([unset], epochs=1)
        raised = "no error"
    except ValueError as exc:
        raised = "ValueError"
    best = hvd.callbacks.BestModelCheckpoint(monitor="loss", mode="min")
    best.filepath = os.path.join(folder, "best.keras")
    trained([best], epochs=2)
    return [raised, best.save_best_only, os.path.exists(best.filepath)]

@check("passes_per_step")
def _():
    return fit_identity(hvd, passes=2, optimizer=lambda: keras.optimizers.SGD(0.1, momentum=0.5))

@check("passes_per_step_sum")
def _():
    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    model.compile(optimizer=opt, loss="mse")
    before = [w.copy() for w in model.get_weights()]
    xs = np.ones((4, 6), "float32") * (r + 1)
    model.fit(xs, np.zeros((4, 3), "float32"), batch_size=2, epochs=1, shuffle=False, verbose=0)
    reference = make_model()
    both = np.concatenate([np.ones((4, 6), "float32"), 2 * np.ones((4, 6), "float32")])
    # summed over 2 passes (not averaged) == one step on the whole data with the loss doubled
    reference.compile(optimizer=keras.optimizers.SGD(2.0), loss="mse")
    reference.fit(both, np.zeros((8, 3), "float32"), batch_size=8, epochs=1, shuffle=False, verbose=0)
    return [max_diff(model.get_weights(), reference.get_weights()), int(opt.iterations.numpy()),
            max_diff(before, model.get_weights()) > 0]

@check("fit_fp16_groups_predivide")
def _():
    return [fit_identity(hvd, compression=hvd.Compression.fp16, epochs=1),
            fit_identity(hvd, groups=2, gradient_predivide_factor=2.0, epochs=1),
            fit_identity(hvd_any, compression=hvd_any.Compression.bf16, epochs=1)]

@check("partial_optimizer")
def _():
    model = make_model()
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[model.layers[-1]])
    model.compile(optimizer=opt, loss=loss)
    model.fit(shard(x, r, n, 8), shard(y, r, n, 8), batch_size=8, epochs=1, shuffle=False, verbose=0)
    # (softmax cross-entropy gradients sum to zero over the classes: compare squares, not sums)
    return [float(np.sum(np.square(model.layers[0].kernel.numpy()))),
            float(np.sum(np.square(model.layers[-1].kernel.numpy())))]

@check("optimizer_wrapper")
def _():
    inner = keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(inner)
    opt.learning_rate = 0.3
    out = [isinstance(opt, keras.optimizers.Optimizer), type(opt).__name__, opt.name,
           float(inner.learning_rate.numpy()), opt.momentum, opt.nesterov]
    for bad in [lambda: hvd.DistributedOptimizer(opt), lambda: hvd.DistributedOptimizer("sgd"),
                lambda: hvd.DistributedOptimizer(inner, backward_passes_per_step=0),
                lambda: hvd.DistributedOptimizer(inner, op=hvd.Sum, gradient_predivide_factor=2.0)]:
        try:
            bad()
            out.append("no error")
        except ValueError:
            out.append("ValueError")
    config = opt.get_config()
    again = hvd.DistributedOptimizer.from_config(config)
    out += [type(again.inner_optimizer).__name__, again.inner_optimizer.momentum,
            type(hvd_tf.DistributedOptimizer(keras.optimizers.Adam())).__name__]
    return out

@check("keras2_spellings")
def _():
    # Horovod's scripts were written for Keras 2: `opt.variables()` called, `opt.lr`, `opt.weights`.
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model = make_model()
    model.compile(optimizer=opt, loss=loss)
    model.fit(shard(x, r, n, 8)[:8], shard(y, r, n, 8)[:8], batch_size=8, epochs=1, verbose=0)
    called = opt.variables()
    hvd_tf.broadcast_variables(opt.variables(), root_rank=0)
    read = float(opt.lr.numpy())
    opt.lr = 0.05
    return [len(called), [v.path for v in called] == [v.path for v in opt.variables],
            len(opt.weights) == len(called), read, float(opt.inner_optimizer.learning_rate.numpy()),
            float(np.sum([np.sum(v.numpy()) for v in called]))]

@check("load_model")
def _():
    folder = tempfile.mkdtemp()
    model = trained([], optimizer=keras.optimizers.Adam(0.01), epochs=1)
    model.save(os.path.join(folder, "distributed.keras"))
    plain = make_model()
    plain.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss)
    plain.fit(x[:16], y[:16], batch_size=8, epochs=1, verbose=0)
    plain.save(os.path.join(folder, "plain.keras"))
    a = hvd.load_model(os.path.join(folder, "distributed.keras"))
    b = hvd.load_model(os.path.join(folder, "plain.keras"), compression=hvd.Compression.fp16)
    c = keras.models.load_model(os.path.join(folder, "distributed.keras"))
    out = [f"{type(m.optimizer).__name__}({isinstance(m.optimizer, hvd.DistributedOptimizer)})" for m in (a, b, c)]
    out += [type(b.optimizer.inner_optimizer).__name__, int(a.optimizer.iterations.numpy()),
            int(b.optimizer.iterations.numpy()), max_diff(a.get_weights(), model.get_weights())]
    b.fit(shard(x, r, n, 8), shard(y, r, n, 8), batch_size=8, epochs=1, shuffle=False, verbose=0)
    out.append(float(np.sum(b.layers[0].kernel.numpy())))
    return out

@check("values")
def _():
    return [hvd.allreduce(np.array([1.0, 2.0]) * (r + 1)), hvd.allreduce(keras.ops.ones(2) * r, op=hvd.Sum),
            hvd.allreduce([r + 1.0], compression=hvd.Compression.fp16, name="c"),
            hvd.allgather(np.full((r + 1, 1), r)), hvd.broadcast(np.array([r, r]), 1),
            hvd.reducescatter(np.arange(4.0).reshape(4, 1) * (r + 1)), type(hvd.allreduce(1.0)).__name__]

@check("xla")
def _():
    """jit_compile=True (and what "auto" asks on a GPU): the model compiles without XLA and trains."""
    import warnings
    from keras.src.trainers.trainer import model_supports_jit
    model = make_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss, jit_compile=True)
    model.fit(x[r::n], y[r::n], batch_size=8, epochs=1, shuffle=False, verbose=0)
    plain = make_model()
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, jit_compile=True)
    # docs/tensorflow.md's way to keep XLA for forward and backward: reduce outside the compiled function
    custom = make_model()

    @tf.function(jit_compile=True)
    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            value = loss(yb, custom(xb, training=True))
        return tape.gradient(value, custom.trainable_variables)

    keras.optimizers.SGD(0.1).apply_gradients(zip(hvd_tf.grouped_allreduce(gradients(x[r::n][:8], y[r::n][:8])),
                                                  custom.trainable_variables))
    return {"custom_step": float(sum(np.sum(w) for w in custom.get_weights())), "jit": model.jit_compile, "warned": [str(w.message) for w in caught if "jit_compile" in str(w.message)],
            "auto_would_use_xla": model_supports_jit(model), "plain_keeps_xla": plain.jit_compile,
            "weights": float(sum(np.sum(w) for w in model.get_weights()))}

@check("broadcast_global_variables")
def _():
    try:
        hvd.broadcast_global_variables(0)
        return "no error"
    except RuntimeError:
        return "RuntimeError"
'''


@pytest.fixture(scope="module")
def run():
    return run_tf(SNIPPET, timeout=300)


def both(run, key):
    return [ok(results(run, rank)[key]) for rank in (0, 1)]


def test_job_succeeded(run):
    run.check()


def test_schedule_staircase(run):
    for lrs, logged in both(run, "schedule_staircase"):
        # epoch 0 before start_epoch keeps the optimizer's 0.1; then 0.2 * 0.5**(epoch-1); unchanged after end_epoch
        assert lrs == pytest.approx([0.1, 0.2, 0.1, 0.1])
        assert logged == pytest.approx([0.1, 0.2, 0.1, 0.1])


def test_schedule_per_batch(run):
    for lrs in both(run, "schedule_smooth"):
        assert lrs == pytest.approx([1.0 / (1.0 + e + b / 4) for e in range(2) for b in range(4)])


def test_momentum_correction(run):
    for before, after, old_lr, new_lr in both(run, "momentum_correction"):
        assert old_lr == pytest.approx(0.1) and new_lr == pytest.approx(0.01)
        assert after == pytest.approx(before * 0.1, rel=1e-4)


def test_warmup(run):
    for rank, (lrs, printed) in enumerate(both(run, "warmup")):
        want = [0.4 / 2 * (1 + (e + b / 4) / 2) for e in range(2) for b in range(4)]
        assert lrs[:8] == pytest.approx(want) and lrs[8:] == pytest.approx([want[-1]] * 4)
        assert printed == (rank == 0)


def test_metric_average(run):
    (raw0, avg0), (raw1, avg1) = both(run, "metric_average")
    assert raw0 != raw1
    assert avg0 == avg1 == pytest.approx([(a + b) / 2 for a, b in zip(raw0, raw1)])


def test_broadcast_callback(run):
    (kernel0, local0, slot0), (kernel1, local1, slot1) = both(run, "broadcast_callback")
    assert kernel0 == kernel1 and slot0 == slot1
    assert local0 != local1  # local_variables are not broadcast


def test_best_model_checkpoint(run):
    for got in both(run, "best_checkpoint"):
        assert got == ["ValueError", True, True]


def test_backward_passes_per_step_matches_bigger_batches(run):
    for got in both(run, "passes_per_step"):
        assert got["weights"] < 1e-5 and got["iterations"] == 3 * 64 // 8  # every pass counts, as in Horovod


def test_backward_passes_per_step_sums_by_default(run):
    for diff, iterations, moved in both(run, "passes_per_step_sum"):
        assert diff < 1e-5 and iterations == 2 and moved  # one update, two passes counted


def test_compression_groups_predivide_keep_identity(run):
    for fp16, grouped, bf16 in both(run, "fit_fp16_groups_predivide"):
        assert fp16["weights"] < 1e-2 and grouped["weights"] < 1e-5 and bf16["weights"] < 5e-2


def test_partial_distributed_optimizer(run):
    (shared0, local0), (shared1, local1) = both(run, "partial_optimizer")
    assert shared0 == pytest.approx(shared1, abs=1e-6)  # averaged gradients: still identical
    assert local0 != pytest.approx(local1, abs=1e-4)  # this rank's own gradients: ranks drift apart


def test_optimizer_wrapper(run):
    for got in both(run, "optimizer_wrapper"):
        assert got[:6] == [True, "SGD", "DistributedSGD", pytest.approx(0.3), 0.9, True]
        assert got[6:10] == ["ValueError"] * 4
        assert got[10:] == ["SGD", 0.9, "Adam"]


def test_keras2_spellings_on_the_optimizer(run):
    out0, out1 = both(run, "keras2_spellings")
    for out in (out0, out1):
        assert out[0] >= 2 and out[1:3] == [True, True]  # iterations and a momentum slot at least
        assert out[3:5] == [pytest.approx(0.1), pytest.approx(0.05)]
    assert out0[5] == pytest.approx(out1[5], abs=1e-6)  # broadcast from rank 0: identical everywhere


def test_load_model(run):
    out0, out1 = both(run, "load_model")
    for out in (out0, out1):
        assert out[:4] == ["Adam(True)"] * 3 + ["Adam"]  # a DistributedOptimizer, named after the wrapped class
        assert out[4] == 4 and out[5] == 2 and out[6] == 0.0
    assert out0[7] == pytest.approx(out1[7], abs=1e-6)  # training on after loading keeps ranks identical


def test_value_functions(run):
    for rank, got in enumerate(both(run, "values")):
        assert got[0] == [1.5, 3.0] and got[1] == [1.0, 1.0] and got[2] == [1.5]
        assert got[3] == [[0], [1], [1]] and got[4] == [1, 1]
        assert got[5] == ([[0.0], [1.5]] if rank == 0 else [[3.0], [4.5]])
        assert got[6] == "ndarray"


def test_broadcast_global_variables_explains(run):
    assert both(run, "broadcast_global_variables") == ["RuntimeError"] * 2


def test_jit_compile_falls_back_to_no_xla(run):
    zero, one = both(run, "xla")
    for got in (zero, one):
        assert got["jit"] is False and got["auto_would_use_xla"] is False and got["plain_keeps_xla"] is True
        assert got["warned"] == ["Model doesn't support `jit_compile=True`. Proceeding with `jit_compile=False`."]
    assert zero["weights"] == one["weights"]  # trained, with the gradients reduced
    assert zero["custom_step"] == one["custom_step"]  # XLA-compiled gradients, reduced outside
