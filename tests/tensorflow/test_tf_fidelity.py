"""TensorFlow drop-in details on 2 real ranks: tf.compat.v1 optimizers aggregate
`backward_passes_per_step` passes (eagerly and in a TF1 graph), IndexedSlices reduce with
Min/Max/Product by gathering as Horovod does, reducescatter(op=Adasum) raises a RuntimeError, and
a collective inside tf.function(jit_compile=True) fails at trace time naming the function."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import ok, results, run_tf  # noqa: E402

SNIPPET = r'''
import horovod.tensorflow as hvd

hvd.init()
r = hvd.rank()

@check("v1_aggregation_eager")
def _():
    out = {}
    for average in (False, True):
        w = tf.Variable([1.0, 1.0])
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5), backward_passes_per_step=2,
                                       average_aggregated_gradients=average)
        seen = []
        for step in range(4):
            p = step % 2 + 1
            opt.apply_gradients(opt.compute_gradients(lambda: tf.reduce_sum(w * (r + 1) * p), var_list=[w]))
            seen.append(w.numpy().tolist())
        out[str(average)] = seen
    return out

@check("v1_aggregation_graph")
def _():
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable([1.0, 1.0])
        p = tf.compat.v1.placeholder(tf.float32, [])
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.5, 0.9), backward_passes_per_step=2)
        train = opt.minimize(tf.reduce_sum(w * (r + 1) * p))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            seen = []
            for step in range(4):
                session.run(train, {p: step % 2 + 1})
                seen.append(session.run(w).tolist())
            return seen

@check("sparse_ops")
def _():
    def reduce(op):
        s = tf.IndexedSlices(tf.constant([[1.0, 2.0]]) * (r + 1), tf.constant([r], tf.int64), tf.constant([2, 2], tf.int64))
        out = hvd.allreduce(s, op=op, name=f"sparse{op}")
        return [type(out).__name__, out.values, out.indices]
    return {str(op): modes(lambda op=op: reduce(op)) for op in (hvd.Min, hvd.Max, hvd.Product)}

@check("reducescatter_adasum")
def _():
    try:
        hvd.reducescatter(tf.ones([4]), op=hvd.Adasum)
        return None
    except RuntimeError as exc:
        return type(exc).__name__

@check("jit_compile")
def _():
    @tf.function(jit_compile=True)
    def compiled_step(x):
        return hvd.allreduce(x * 2.0, op=hvd.Sum)
    try:
        compiled_step(tf.ones([3]))
        error = None
    except NotImplementedError as exc:
        error = str(exc)
    return [error, hvd.allreduce(tf.ones([1]), op=hvd.Sum, name="after_jit")]

done()
'''


@pytest.fixture(scope="module")
def run():
    return run_tf(SNIPPET)


def both_ranks(run, key):
    return [ok(results(run, rank)[key]) for rank in (0, 1)]


def test_v1_optimizer_aggregates_backward_passes_eagerly(run):
    # passes 1 and 2 give gradients (r+1) and 2(r+1): summed 3(r+1), averaged over ranks 4.5
    # (or 2.25 with average_aggregated_gradients); only every second apply_gradients applies.
    for got in both_ranks(run, "v1_aggregation_eager"):
        assert got["False"] == [[1.0, 1.0], [-1.25, -1.25], [-1.25, -1.25], [-3.5, -3.5]]
        assert got["True"] == [[1.0, 1.0], [-0.125, -0.125], [-0.125, -0.125], [-1.25, -1.25]]


def test_v1_optimizer_aggregates_backward_passes_in_a_graph(run):
    # momentum 0.9: the second application uses velocity 0.9 * 4.5 + 4.5; slots move only on applies
    for got in both_ranks(run, "v1_aggregation_graph"):
        assert [[round(v, 4) for v in w] for w in got] == [[1.0, 1.0], [-1.25, -1.25], [-1.25, -1.25],
                                                           [-5.525, -5.525]]


def test_indexed_slices_min_max_product_gather_like_horovod(run):
    for got in both_ranks(run, "sparse_ops"):
        for op_result in got.values():
            for kind, values, indices in op_result.values():
                assert kind == "IndexedSlices" and values == [[1.0, 2.0], [2.0, 4.0]] and indices == [0, 1]


def test_reducescatter_adasum_raises_a_runtime_error(run):
    assert both_ranks(run, "reducescatter_adasum") == ["HorovodInternalError"] * 2


def test_collectives_under_jit_compile_fail_early_naming_the_function(run):
    for error, after in both_ranks(run, "jit_compile"):
        assert error is not None and "jit_compile=True" in error and "compiled_step" in error
        assert after == [2.0]
