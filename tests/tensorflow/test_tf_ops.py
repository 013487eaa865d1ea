"""horovod.tensorflow collectives on 2 real ranks: values, dtypes, static shapes and gradients,
each eagerly and inside tf.function. One horovodrun job; each test asserts on its part."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import ok, results, run_tf  # noqa: E402

SNIPPET = r'''
import warnings
import horovod.tensorflow as hvd

singletons = [hvd.ProcessSet([0]), hvd.ProcessSet([1])]
hvd.init(process_sets=singletons)
r, n = hvd.rank(), hvd.size()
x = tf.constant([1.0, 2.0]) * (r + 1)

@check("allreduce_ops")
def _():
    return {name: modes(lambda op=op: hvd.allreduce(x, op=op))
            for name, op in [("avg", hvd.Average), ("sum", hvd.Sum), ("min", hvd.Min), ("max", hvd.Max),
                             ("prod", hvd.Product)]}

@check("allreduce_dtypes")
def _():
    out = {}
    for dtype in [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
                  tf.float64]:
        y = modes(lambda: hvd.allreduce(tf.cast(x, dtype), op=hvd.Sum))
        out[dtype.name] = {k: [v.dtype.name, tf.cast(v, tf.float64).numpy().tolist()] for k, v in y.items()}
    out["bool"] = modes(lambda: hvd.allreduce(tf.constant([r == 0, True]), op=hvd.Max))
    return out

@check("allreduce_int_average")
def _():
    return modes(lambda: hvd.allreduce(tf.constant([3, 4]) + r))

@check("allreduce_scaling")
def _():
    return modes(lambda: hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0))

@check("allreduce_compression")
def _():
    return {c: {k: [v.dtype.name, v] for k, v in modes(lambda comp=comp: hvd.allreduce(x, compression=comp)).items()}
            for c, comp in [("fp16", hvd.Compression.fp16), ("bf16", hvd.Compression.bf16)]}

@check("allreduce_average_flag")
def _():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summed = hvd.allreduce(x, average=False)
    try:
        hvd.allreduce(x, average=True, op=hvd.Sum)
        both = "no error"
    except ValueError:
        both = "ValueError"
    return [summed, any(issubclass(w.category, DeprecationWarning) for w in caught), both]

@check("allreduce_sparse")
def _():
    def fn():
        s = tf.IndexedSlices(tf.constant([[1.0, 1.0]]) * (r + 1), tf.constant([r], tf.int64),
                             tf.constant([2, 2], tf.int64))
        out = hvd.allreduce(s)
        return [type(out).__name__, out.values, out.indices, tf.convert_to_tensor(out)]
    return modes(fn)

@check("grouped_allreduce")
def _():
    return modes(lambda: hvd.grouped_allreduce([x, tf.constant([[5.0]]) * (r + 1)], op=hvd.Sum))

@check("allgather")
def _():
    return modes(lambda: hvd.allgather(tf.fill([r + 1, 2], float(r))))

@check("grouped_allgather")
def _():
    return modes(lambda: hvd.grouped_allgather([tf.fill([r + 1], r), tf.fill([1, 2], 1.5 * r)]))

@check("broadcast")
def _():
    return modes(lambda: hvd.broadcast(x, 1))

@check("broadcast_inplace")
def _():
    v = tf.Variable([float(r), 7.0 * r])
    eager = hvd.broadcast_([v], 1)[0]
    v.assign([float(r), 7.0 * r])
    tf.function(lambda: hvd.broadcast_([v], 1))()
    return [eager, v]

@check("alltoall")
def _():
    t = tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]) + 10 * r
    def fn():
        out, splits = hvd.alltoall(t, splits=[1, 3])
        return [out, splits, hvd.alltoall(t)]
    return modes(fn)

@check("reducescatter")
def _():
    t = tf.reshape(tf.range(10, dtype=tf.float32), [5, 2]) * (r + 1)
    return modes(lambda: [hvd.reducescatter(t), hvd.reducescatter(t, op=hvd.Sum),
                          hvd.grouped_reducescatter([t, t[:, :1]], op=hvd.Sum)])

@check("topology_ops")
def _():
    return modes(lambda: [hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(), hvd.local_size_op(),
                          hvd.size_op(process_set_id=1), hvd.process_set_included_op(1),
                          hvd.process_set_included_op(2), hvd.process_set_included_op(9)])

@check("process_set")
def _():
    return modes(lambda: hvd.allreduce(x, op=hvd.Sum, process_set=singletons[r]))

@check("static_shapes")
def _():
    spec = tf.TensorSpec([None, 3], tf.float32)
    def fn(t):
        out, splits = hvd.alltoall(t, splits=[0, 0])
        return [hvd.allreduce(t), hvd.allgather(t), hvd.broadcast(t, 0), out, splits, hvd.reducescatter(t),
                hvd.join()]
    graph = tf.function(fn).get_concrete_function(spec).structured_outputs
    return [str(o.shape) for o in graph]

@check("retrace")
def _():
    f = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, name="same"))
    return [f(tf.ones([2])), f(tf.ones([3])), f(tf.ones([2, 2])), f(tf.ones([2]))]

@check("join")
def _():
    import time
    out = {}
    if r == 0:
        out["last"] = hvd.join()
    else:
        time.sleep(0.3)
        out["reduced"] = hvd.allreduce(tf.constant([2.0, 2.0]), name="while_joined")
        out["last"] = hvd.join()
    out["graph"] = tf.function(hvd.join)()
    return out

@check("objects")
def _():
    obj = hvd.broadcast_object({"rank": r, "text": "x" * (r + 3)}, root_rank=1)
    return [obj, hvd.allgather_object((r, "a" * r)), hvd.broadcast_object_fn(root_rank=0)(r * 10)]

@check("broadcast_variables")
def _():
    a, b = tf.Variable([float(r)] * 3), tf.Variable(r + 5)
    hvd.broadcast_variables([a, b], root_rank=1)
    eager = [a.numpy(), b.numpy()]
    a.assign([float(r)] * 3)
    tf.function(lambda: hvd.broadcast_variables([a], root_rank=0))()
    return [eager, a]

@check("errors")
def _():
    out = {}
    for label, fn in [("complex", lambda: hvd.allreduce(tf.constant([1j]))),
                      ("shape_mismatch", lambda: hvd.allreduce(tf.ones([2 + r]), name="mismatch")),
                      ("graph_shape_mismatch", tf.function(lambda: hvd.allreduce(tf.ones([2 + r]), name="gm"))),
                      ("rank0_gather", lambda: hvd.allgather(tf.constant(1.0))),
                      ("bad_root", lambda: hvd.broadcast(x, root_rank=5)),
                      ("sparse_adasum", lambda: hvd.allreduce(tf.IndexedSlices(x, tf.constant([0, 1])), op=hvd.Adasum))]:
        try:
            fn()
            out[label] = "no error"
        except Exception as exc:
            out[label] = [type(exc).__name__, "HorovodInternalError" in (type(exc).__name__ + str(exc))]
    out["after"] = hvd.allreduce(x, op=hvd.Sum, name="after_errors")
    return out

# ---- gradients ----------------------------------------------------------------------------------
def grad_of(op_fn):
    """Gradient of sum(op(v) * (rank + 1)) w.r.t. v, eagerly and in a tf.function."""
    v = tf.Variable(tf.reshape(tf.range(4, dtype=tf.float32), [2, 2]))
    def fn():
        with tf.GradientTape() as tape:
            y = op_fn(v)
            loss = tf.reduce_sum(y * tf.reshape(tf.range(tf.size(y), dtype=tf.float32), tf.shape(y)) * (r + 1))
        return tape.gradient(loss, v)
    return modes(fn)

@check("grad_allreduce")
def _():
    return {"avg": grad_of(lambda v: hvd.allreduce(v)), "sum": grad_of(lambda v: hvd.allreduce(v, op=hvd.Sum)),
            "grouped": grad_of(lambda v: hvd.grouped_allreduce([v, 2 * v], op=hvd.Sum)[1])}

@check("grad_allgather")
def _():
    return {"single": grad_of(lambda v: hvd.allgather(v[: r + 1])),
            "grouped": grad_of(lambda v: hvd.grouped_allgather([v[: r + 1], v])[0])}

@check("grad_broadcast")
def _():
    return grad_of(lambda v: hvd.broadcast(v, 0))

@check("grad_alltoall")
def _():
    return grad_of(lambda v: hvd.alltoall(v, splits=[1, 1])[0])

@check("grad_reducescatter")
def _():
    return {"avg": grad_of(lambda v: hvd.reducescatter(v)), "sum": grad_of(lambda v: hvd.reducescatter(v, op=hvd.Sum))}

# ---- DistributedGradientTape --------------------------------------------------------------------
def tape_grads(**options):
    w = tf.Variable([1.0, 1.0])
    u = tf.Variable([2.0, 2.0])
    emb = tf.Variable(tf.ones([3, 2]))
    def fn():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * (r + 1)) + tf.reduce_sum(u * (r + 1) * 10)
            loss += tf.reduce_sum(tf.gather(emb, [r]) * (r + 1))
        grads = hvd.DistributedGradientTape(tape, **options).gradient(loss, {"w": w, "u": u, "emb": emb})
        return {k: [type(g).__name__, tf.convert_to_tensor(g)] for k, g in grads.items()}
    return modes(fn)

@check("tape_default")
def _():
    return tape_grads()

@check("tape_options")
def _():
    return {"sum": tape_grads(op=hvd.Sum), "predivide": tape_grads(gradient_predivide_factor=2.0),
            "fp16": tape_grads(compression=hvd.Compression.fp16), "groups": tape_grads(groups=1),
            "dense": tape_grads(sparse_as_dense=True)}

@check("tape_local")
def _():
    w, u = tf.Variable([1.0, 1.0]), tf.Variable([2.0, 2.0])
    def fn():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * (r + 1)) + tf.reduce_sum(u * (r + 1) * 10)
        tape = hvd.DistributedGradientTape(tape)
        tape.register_local_source(u)
        return tape.gradient(loss, [w, u])
    return modes(fn)

@check("tape_is_a_tape")
def _():
    with tf.GradientTape(persistent=True) as raw:
        v = tf.constant(3.0)
        raw.watch(v)
        y = v * v
    tape = hvd.DistributedGradientTape(raw)
    return [isinstance(tape, tf.GradientTape), tape.gradient(y, v), tape.gradient(y, v)]

@check("partial_tape")
def _():
    dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    shared = tf.Variable([1.0])
    def fn():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense(tf.ones([1, 2]) * (r + 1))) + tf.reduce_sum(shared * (r + 1))
        tape = hvd.PartialDistributedGradientTape(tape, local_layers=[dense])
        local, global_ = tape.get_local_and_global_gradients(loss, [dense.kernel, shared])
        return [local, global_]
    return modes(fn)

@check("tf1_graph_session")
def _():
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable([float(r), 1.0])
        w = tf.compat.v1.Variable([1.0, 1.0])
        bcast = hvd.broadcast_global_variables(1)
        reduced = hvd.allreduce(v, op=hvd.Sum)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        train = opt.minimize(tf.reduce_sum(w * (r + 1)))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(bcast)
            after = session.run(v)
            session.run(train)
            return [after, session.run(reduced), session.run(w)]

@check("tf1_hook")
def _():
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable([float(r), 2.0 * r])
        hooks = [hvd.BroadcastGlobalVariablesHook(1)]
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as session:
            return session.run(v)

@check("broadcast_global_variables_eager")
def _():
    try:
        hvd.broadcast_global_variables(0)
        return "no error"
    except RuntimeError as exc:
        return "RuntimeError"

@check("legacy_optimizer")
def _():
    w = tf.Variable([1.0, 1.0])
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    grads = opt.compute_gradients(lambda: tf.reduce_sum(w * (r + 1)), var_list=[w])
    opt.apply_gradients(grads)
    return [type(opt).__name__, grads[0][0], w]
'''


@pytest.fixture(scope="module")
def run():
    return run_tf(SNIPPET)


def both_ranks(run, key):
    return [ok(results(run, rank)[key]) for rank in (0, 1)]


def per_mode(value):
    assert set(value) == {"eager", "graph"}, value
    return value["eager"], value["graph"]


def test_job_succeeded(run):
    run.check()


def test_allreduce_ops(run):
    for got in both_ranks(run, "allreduce_ops"):
        for name, want in [("avg", [1.5, 3.0]), ("sum", [3.0, 6.0]), ("min", [1.0, 2.0]), ("max", [2.0, 4.0]),
                           ("prod", [2.0, 8.0])]:
            assert per_mode(got[name]) == (want, want), name


def test_allreduce_dtypes_keep_their_type(run):
    for got in both_ranks(run, "allreduce_dtypes"):
        for dtype in ["uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]:
            for mode in per_mode(got[dtype]):
                assert mode == [dtype, [3.0, 6.0]], dtype
        assert per_mode(got["bool"]) == ([True, True], [True, True])


def test_integer_average_truncates(run):
    for got in both_ranks(run, "allreduce_int_average"):
        assert per_mode(got) == ([3, 4], [3, 4])


def test_allreduce_prescale_postscale(run):
    for got in both_ranks(run, "allreduce_scaling"):
        assert per_mode(got) == ([18.0, 36.0], [18.0, 36.0])


def test_allreduce_compression_restores_dtype(run):
    for got in both_ranks(run, "allreduce_compression"):
        for name in ("fp16", "bf16"):
            assert per_mode(got[name]) == (["float32", [1.5, 3.0]],) * 2


def test_average_flag_is_deprecated_alias(run):
    for summed, warned, both in both_ranks(run, "allreduce_average_flag"):
        assert summed == [3.0, 6.0] and warned and both == "ValueError"


def test_allreduce_indexed_slices(run):
    for got in both_ranks(run, "allreduce_sparse"):
        for kind, values, indices, dense in per_mode(got):
            assert kind == "IndexedSlices" and indices == [0, 1]
            assert values == [[0.5, 0.5], [1.0, 1.0]] and dense == [[0.5, 0.5], [1.0, 1.0]]


def test_grouped_allreduce(run):
    for got in both_ranks(run, "grouped_allreduce"):
        assert per_mode(got) == ([[3.0, 6.0], [[15.0]]],) * 2


def test_allgather_uneven_rows(run):
    for got in both_ranks(run, "allgather"):
        assert per_mode(got) == ([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]],) * 2


def test_grouped_allgather(run):
    for got in both_ranks(run, "grouped_allgather"):
        assert per_mode(got) == ([[0, 1, 1], [[0.0, 0.0], [1.5, 1.5]]],) * 2


def test_broadcast(run):
    for got in both_ranks(run, "broadcast"):
        assert per_mode(got) == ([2.0, 4.0], [2.0, 4.0])


def test_broadcast_inplace(run):
    for got in both_ranks(run, "broadcast_inplace"):
        assert got == [[1.0, 7.0], [1.0, 7.0]]


def test_alltoall(run):
    got0, got1 = both_ranks(run, "alltoall")
    for out, splits, even in per_mode(got0):
        assert out == [[0.0, 1.0], [10.0, 11.0]] and splits == [1, 1]
        assert even == [[0.0, 1.0], [2.0, 3.0], [10.0, 11.0], [12.0, 13.0]]
    for out, splits, even in per_mode(got1):
        assert out == [[2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [12.0, 13.0], [14.0, 15.0], [16.0, 17.0]]
        assert splits == [3, 3] and even == [[4.0, 5.0], [6.0, 7.0], [14.0, 15.0], [16.0, 17.0]]


def test_reducescatter(run):
    total = [[3.0 * (2 * i), 3.0 * (2 * i + 1)] for i in range(5)]
    for rank, got in enumerate(both_ranks(run, "reducescatter")):
        rows = slice(0, 3) if rank == 0 else slice(3, 5)
        for avg, summed, (grouped_a, grouped_b) in per_mode(got):
            assert summed == total[rows] and grouped_a == total[rows]
            assert avg == [[v / 2 for v in row] for row in total[rows]]
            assert grouped_b == [row[:1] for row in total[rows]]


def test_topology_ops(run):
    for rank, got in enumerate(both_ranks(run, "topology_ops")):
        assert per_mode(got) == ([rank, 2, rank, 2, 1, int(rank == 0), int(rank == 1), -3],) * 2


def test_process_set(run):
    for rank, got in enumerate(both_ranks(run, "process_set")):
        assert per_mode(got) == ([rank + 1.0, 2.0 * (rank + 1)],) * 2


def test_static_shapes_in_tf_function(run):
    for got in both_ranks(run, "static_shapes"):
        assert got == ["(None, 3)", "(None, 3)", "(None, 3)", "(None, 3)", "(2,)", "(None, 3)", "()"]


def test_retracing_with_new_shapes(run):
    for got in both_ranks(run, "retrace"):
        assert got == [[2.0, 2.0], [2.0, 2.0, 2.0], [[2.0, 2.0], [2.0, 2.0]], [2.0, 2.0]]


def test_join(run):
    got0, got1 = both_ranks(run, "join")
    assert got0["last"] == got1["last"] == 1
    assert got1["reduced"] == [1.0, 1.0]  # rank 0 joined: it contributes zeros, Average still divides by 2
    assert got0["graph"] == got1["graph"] in (0, 1)


def test_broadcast_and_allgather_objects(run):
    for rank, (obj, gathered, from0) in enumerate(both_ranks(run, "objects")):
        assert obj == {"rank": 1, "text": "xxxx"}
        assert gathered == [[0, ""], [1, "a"]] and from0 == 0


def test_broadcast_variables(run):
    for got in both_ranks(run, "broadcast_variables"):
        assert got == [[[1.0, 1.0, 1.0], 6], [0.0, 0.0, 0.0]]


def test_errors(run):
    for got in both_ranks(run, "errors"):
        assert got["complex"][0] == "ValueError"
        assert got["rank0_gather"][0] == "ValueError"
        assert got["bad_root"][0] == "ValueError"
        assert got["sparse_adasum"][0] == "NotImplementedError"
        assert got["shape_mismatch"] == ["HorovodInternalError", True]
        assert got["graph_shape_mismatch"][1], got["graph_shape_mismatch"]  # a tf.errors.* naming the cause
        assert got["after"] == [3.0, 6.0]  # the job goes on after a failed collective


def test_gradient_of_allreduce(run):
    weights = [[0.0, 1.0], [2.0, 3.0]]
    for got in both_ranks(run, "grad_allreduce"):
        assert per_mode(got["avg"]) == ([[1.5 * w for w in row] for row in weights],) * 2
        assert per_mode(got["sum"]) == ([[3.0 * w for w in row] for row in weights],) * 2
        assert per_mode(got["grouped"]) == ([[6.0 * w for w in row] for row in weights],) * 2


def test_gradient_of_allgather(run):
    got0, got1 = both_ranks(run, "grad_allgather")
    # output rows: rank 0's 1 row, then rank 1's 2 rows; upstream weights arange * (rank+1), averaged
    assert per_mode(got0["single"]) == ([[0.0, 1.5], [0.0, 0.0]],) * 2
    assert per_mode(got1["single"]) == ([[3.0, 4.5], [6.0, 7.5]],) * 2


def test_gradient_of_broadcast(run):
    got0, got1 = both_ranks(run, "grad_broadcast")
    assert per_mode(got0) == ([[0.0, 1.5], [3.0, 4.5]],) * 2
    assert per_mode(got1) == ([[0.0, 0.0], [0.0, 0.0]],) * 2


def test_gradient_of_alltoall(run):
    got0, got1 = both_ranks(run, "grad_alltoall")
    # row 0 went to rank 0 (weight 1 * position), row 1 to rank 1 (weight 2 * position)
    assert per_mode(got0) == ([[0.0, 1.0], [0.0, 2.0]],) * 2
    assert per_mode(got1) == ([[2.0, 3.0], [4.0, 6.0]],) * 2


def test_gradient_of_reducescatter(run):
    for got in both_ranks(run, "grad_reducescatter"):
        assert per_mode(got["avg"]) == ([[0.0, 1.0], [0.0, 2.0]],) * 2
        assert per_mode(got["sum"]) == ([[0.0, 2.0], [0.0, 4.0]],) * 2


def test_distributed_gradient_tape(run):
    for got in both_ranks(run, "tape_default"):
        for mode in per_mode(got):
            assert mode["w"][1] == [1.5, 1.5]
            assert mode["u"][1] == [15.0, 15.0]
            assert mode["emb"][0] == "IndexedSlices"
            assert mode["emb"][1] == [[0.5, 0.5], [1.0, 1.0], [0.0, 0.0]]


def test_distributed_gradient_tape_options(run):
    for got in both_ranks(run, "tape_options"):
        for name, w, emb_kind in [("sum", 3.0, "IndexedSlices"), ("predivide", 1.5, "IndexedSlices"),
                                  ("fp16", 1.5, "IndexedSlices"), ("groups", 1.5, "IndexedSlices"),
                                  ("dense", 1.5, None)]:
            for mode in per_mode(got[name]):
                assert mode["w"][1] == [w, w], name
                if emb_kind:
                    assert mode["emb"][0] == emb_kind, name
                else:
                    assert mode["emb"][0] != "IndexedSlices", name


def test_register_local_source(run):
    for rank, got in enumerate(both_ranks(run, "tape_local")):
        local = 10.0 * (rank + 1) / 2
        assert per_mode(got) == ([[1.5, 1.5], [local, local]],) * 2


def test_tape_keeps_tape_behaviour(run):
    for got in both_ranks(run, "tape_is_a_tape"):
        assert got == [True, 6.0, 6.0]


def test_partial_tape_local_and_global_gradients(run):
    for rank, got in enumerate(both_ranks(run, "partial_tape")):
        scale = (rank + 1) / 2  # a local layer's gradient stays on its rank, divided by the set size
        assert per_mode(got) == ([[[[scale], [scale]]], [[1.5]]],) * 2


def test_tf1_graph_mode_with_sessions(run):
    for got in both_ranks(run, "tf1_graph_session"):
        assert got == [[1.0, 1.0], [2.0, 2.0], [0.25, 0.25]]


def test_broadcast_global_variables_hook(run):
    for got in both_ranks(run, "tf1_hook"):
        assert got == [1.0, 2.0]


def test_broadcast_global_variables_needs_tf1_graphs(run):
    assert both_ranks(run, "broadcast_global_variables_eager") == ["RuntimeError"] * 2


def test_legacy_tf1_optimizer(run):
    for got in both_ranks(run, "legacy_optimizer"):
        assert got[0] == "_DistributedOptimizer" and got[1] == [1.5, 1.5] and got[2] == [0.25, 0.25]
