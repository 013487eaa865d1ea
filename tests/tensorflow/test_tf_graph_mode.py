"""Many collectives in one graph never deadlock: TF1 sessions, tf.function and eager, on 2 and 3 real
ranks, with 1, 2 and the default number of inter-op threads.

Each job builds the collectives that used to hang in one `session.run` (several fused allreduces,
uneven and grouped reducescatter with scaling, grouped allreduce of IndexedSlices, the gradient of
broadcast, allgather of uneven rows, alltoall), then a random mix of 30 collectives whose graph
every rank builds in its own order (a different TF seed and shuffle per rank). Every value is
checked against numpy. A hang fails the test at the job's timeout, it cannot stall the suite.
"""

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import ok, results, run_tf  # noqa: E402

SNIPPET = r'''
import random
import horovod.tensorflow as hvd

THREADS = {threads}  # inter-op threads of the sessions and of tf.function (0: TF's default)
tf.config.threading.set_inter_op_parallelism_threads(THREADS)
hvd.init()
r, n = hvd.rank(), hvd.size()
KINDS = ["allreduce", "average", "grouped_allreduce", "allgather", "broadcast", "reducescatter",
         "grouped_reducescatter", "sparse", "broadcast_grad", "alltoall"]

def data(rank, i, rows):
    return np.random.default_rng([rank, i]).normal(size=(rows, 3)).astype(np.float32)

def build(kind, i):
    """(outputs, expected) of collective number i: explicit names, so any build order matches."""
    name = f"c{{i}}"
    if kind in ("allreduce", "average"):
        op = hvd.Sum if kind == "allreduce" else hvd.Average
        total = sum(data(s, i, 2) for s in range(n))
        return [hvd.allreduce(tf.constant(data(r, i, 2)), op=op, name=name)], [total if op == hvd.Sum else total / n]
    if kind == "grouped_allreduce":
        outs = hvd.grouped_allreduce([tf.constant(data(r, i, 1)), tf.constant(data(r, i + 1000, 4))], op=hvd.Sum,
                                     name=name)
        return outs, [sum(data(s, i, 1) for s in range(n)), sum(data(s, i + 1000, 4) for s in range(n))]
    if kind == "allgather":
        rows = lambda s: 1 + (s + i) % 3
        return ([hvd.allgather(tf.constant(data(r, i, rows(r))), name=name)],
                [np.concatenate([data(s, i, rows(s)) for s in range(n)])])
    if kind == "broadcast":
        root = i % n
        return [hvd.broadcast(tf.constant(data(r, i, 2)), root, name=name)], [data(root, i, 2)]
    if kind == "reducescatter":  # uneven: 2n+1 rows
        total = sum(data(s, i, 2 * n + 1) for s in range(n))
        return ([hvd.reducescatter(tf.constant(data(r, i, 2 * n + 1)), op=hvd.Sum, name=name)],
                [np.array_split(total, n)[r]])
    if kind == "grouped_reducescatter":
        xs = [tf.constant(data(r, i, n + 1)), tf.constant(data(r, i + 1000, 3 * n))]
        outs = hvd.grouped_reducescatter(xs, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0, name=name)
        return outs, [np.array_split(1.5 * sum(data(s, j, k) for s in range(n)), n)[r]
                      for j, k in ((i, n + 1), (i + 1000, 3 * n))]
    if kind == "sparse":
        def slices(s, j):
            return tf.IndexedSlices(tf.constant(data(s, j, 2)), tf.constant([j % 5, (s + 1) % 5]), [5, 3])
        outs = hvd.grouped_allreduce([slices(r, i), slices(r, i + 1000)], op=hvd.Sum, name=name)
        return [tf.convert_to_tensor(o) for o in outs], [_dense(i), _dense(i + 1000)]
    if kind == "broadcast_grad":
        root = (i + 1) % n
        x = tf.constant(data(r, i, 2))
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(hvd.broadcast(x, root, name=name) * float(r + 1))
        grad = tape.gradient(loss, x)
        want = np.full((2, 3), (n + 1) / 2 if r == root else 0.0, np.float32)
        return [grad], [want]
    if kind == "alltoall":
        return [hvd.alltoall(tf.constant(data(r, i, n)), name=name)], [np.stack([data(s, i, n)[r] for s in range(n)])]
    raise AssertionError(kind)

def _dense(j):
    out = np.zeros((5, 3), np.float32)
    for s in range(n):
        np.add.at(out, [j % 5, (s + 1) % 5], data(s, j, 2))
    return out

FIXED = [(kind, i) for i, kind in enumerate(KINDS + ["allreduce"] * 5)]
_kinds = random.Random(11)
MIXED = [(_kinds.choice(KINDS), 100 + i) for i in range(30)]

def errors(outputs, expected):
    return [f"{{k}}: {{np.max(np.abs(np.asarray(o) - e))}}" for k, (o, e) in enumerate(zip(outputs, expected))
            if np.asarray(o).shape != e.shape or not np.allclose(o, e, atol=1e-4)]

def in_session(specs, inter_op, shuffle):
    """All collectives fetched by one session.run, built in this rank's own order when `shuffle`."""
    order = list(specs)
    if shuffle:
        random.Random(r).shuffle(order)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(r)
        outputs, expected = [], []
        for kind, i in order:
            outs, want = build(kind, i)
            outputs += outs
            expected += want
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op, intra_op_parallelism_threads=1,
                                          use_per_session_threads=True)  # not the first session's pool
        with tf.compat.v1.Session(config=config) as session:
            return [errors(session.run(outputs), expected) for _ in range(2)]

def traced_and_eager(specs):
    tf.random.set_seed(r)
    def step():
        pairs = [build(kind, i) for kind, i in specs]
        return [o for outs, _ in pairs for o in outs], [e for _, want in pairs for e in want]
    expected = step()[1]
    traced = tf.function(lambda: step()[0])
    return {{"eager": errors(step()[0], expected), "function": [errors(traced(), expected) for _ in range(2)]}}

@check("session_error")
def _():
    """A bad collective fails on every rank with the core's message; the session goes on working."""
    with tf.Graph().as_default():
        bad = hvd.allreduce(tf.ones([r + 1]), name="bad")
        x = tf.compat.v1.placeholder(tf.float32, [2])
        good = hvd.allreduce(x, op=hvd.Sum, name="good")
        with tf.compat.v1.Session() as session:
            try:
                session.run(bad)
                error = "no error"
            except tf.errors.OpError as exc:
                error = exc.message
            return ["mismatched ALLREDUCE tensor shapes" in error, session.run(good, {{x: [1.0, 2.0]}}).tolist()]

for name, specs, shuffle in (("fixed", FIXED, False), ("mixed", MIXED, True)):
    check(f"session_{{name}}")(lambda: in_session(specs, THREADS, shuffle))
    check(f"traced_{{name}}")(lambda: traced_and_eager(specs))
'''

CONFIGS = [(2, 1), (2, 2), (2, 0), (3, 1), (3, 2), (3, 0)]


@pytest.mark.parametrize("np_, threads", CONFIGS, ids=[f"np{n}-threads{t or 'default'}" for n, t in CONFIGS])
def test_many_collectives_in_one_graph(np_, threads):
    run = run_tf(SNIPPET.format(threads=threads), np=np_, timeout=180)
    for rank in range(np_):
        got = results(run, rank)
        for name in ("fixed", "mixed"):
            assert ok(got[f"session_{name}"]) == [[], []], (rank, name)
            assert ok(got[f"traced_{name}"]) == {"eager": [], "function": [[], []]}, (rank, name)
        assert ok(got["session_error"]) == [True, [float(np_), 2.0 * np_]], rank
    run.check()
