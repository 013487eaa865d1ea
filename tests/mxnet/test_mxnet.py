"""horovod.mxnet on real ranks, in MXNet's own environment: collectives exact on 2-3 ranks, the
optimizer wrappers, and Gluon training on 2 ranks equal to one process on the whole batch."""

import pytest

from multirank import hvdrun

COLLECTIVES = r'''
import mxnet as mx, numpy as np
import horovod.mxnet as hvd

hvd.init(process_sets="dynamic")
r, n = hvd.rank(), hvd.size()
first_two = hvd.add_process_set(hvd.ProcessSet([0, 1])) if n > 2 else hvd.global_process_set
x = mx.nd.array(np.arange(6.0).reshape(3, 2) + r)
total = sum(np.arange(6.0).reshape(3, 2) + k for k in range(n))
ok = {}
ok["average"] = np.allclose(hvd.allreduce(x).asnumpy(), total / n)
ok["sum"] = np.array_equal(hvd.allreduce(x, op=hvd.Sum).asnumpy(), total)
ok["average_false"] = np.array_equal(hvd.allreduce(x, average=False).asnumpy(), total)
ok["min_max"] = (np.array_equal(hvd.allreduce(x, op=hvd.Min).asnumpy(), x.asnumpy() - r)
                 and np.array_equal(hvd.allreduce(x, op=hvd.Max).asnumpy(), x.asnumpy() - r + n - 1))
ok["scaled"] = np.allclose(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25).asnumpy(), total / 2)
y = x.copy()
ok["in_place"] = hvd.allreduce_(y, op=hvd.Sum) is y and np.array_equal(y.asnumpy(), total)
ints = mx.nd.array(np.full(4, r + 1), dtype=np.int32)
ok["int_product"] = np.array_equal(hvd.allreduce(ints, op=hvd.Product).asnumpy(), np.full(4, np.prod(np.arange(1, n + 1))))
g = hvd.grouped_allreduce([x, mx.nd.ones(3, dtype=np.float16)], op=hvd.Sum)
ok["grouped"] = np.array_equal(g[0].asnumpy(), total) and g[1].dtype == np.float16 and np.array_equal(g[1].asnumpy(), np.full(3, n))
pair = [x.copy(), mx.nd.ones(2)]
hvd.grouped_allreduce_(pair, op=hvd.Sum)
ok["grouped_in_place"] = np.array_equal(pair[0].asnumpy(), total) and np.array_equal(pair[1].asnumpy(), [n, n])
ragged = hvd.allgather(mx.nd.full((r + 1, 2), r))
ok["allgather"] = np.array_equal(ragged.asnumpy(), np.concatenate([np.full((k + 1, 2), k) for k in range(n)]))
ga = hvd.grouped_allgather([x, mx.nd.ones(1) * r])
ok["grouped_allgather"] = ga[0].shape == (3 * n, 2) and np.array_equal(ga[1].asnumpy(), np.arange(n))
ok["broadcast"] = np.array_equal(hvd.broadcast(x, root_rank=n - 1).asnumpy(), x.asnumpy() - r + n - 1)
z = x.copy()
hvd.broadcast_(z, root_rank=0)
ok["broadcast_in_place"] = np.array_equal(z.asnumpy(), x.asnumpy() - r)
ok["alltoall"] = np.array_equal(hvd.alltoall(mx.nd.array(np.arange(n) + 10 * r)).asnumpy(), 10 * np.arange(n) + r)
splits = [(r + j) % 2 + 1 for j in range(n)]
got, received = hvd.alltoall(mx.nd.array(np.arange(sum(splits)) + 100 * r), splits=mx.nd.array(splits, dtype=np.int32))
ok["alltoall_splits"] = (got.shape[0] == sum((k + r) % 2 + 1 for k in range(n))
                         and received.asnumpy().tolist() == [(k + r) % 2 + 1 for k in range(n)])
ok["reducescatter"] = np.array_equal(hvd.reducescatter(mx.nd.array(np.arange(7.0)), op=hvd.Sum).asnumpy(),
                                     n * np.array_split(np.arange(7.0), n)[r])
rs = hvd.grouped_reducescatter([mx.nd.array(np.arange(7.0)), mx.nd.ones((n, 2))])
ok["grouped_reducescatter"] = np.allclose(rs[0].asnumpy(), np.array_split(np.arange(7.0), n)[r]) and rs[1].shape == (1, 2)
ok["objects"] = hvd.broadcast_object({"r": r}, root_rank=1) == {"r": 1} and hvd.allgather_object(r) == list(range(n))
params = {"b": mx.nd.full(2, r), "a": mx.nd.full(3, 10 + r)}
hvd.broadcast_parameters(params, root_rank=1)
ok["broadcast_parameters"] = np.array_equal(params["a"].asnumpy(), np.full(3, 11)) and np.array_equal(params["b"].asnumpy(), [1, 1])
compressed, ctx = hvd.Compression.fp16.compress(x)
ok["fp16"] = compressed.dtype == np.float16 and hvd.Compression.fp16.decompress(compressed, ctx).dtype == np.float32
if r in (0, 1):
    ok["process_set"] = (np.array_equal(hvd.allreduce(x, op=hvd.Sum, process_set=first_two).asnumpy(), 2 * x.asnumpy() - 2 * r + 1)
                         and hvd.allgather(mx.nd.array([r]), process_set=first_two).shape == (2,))
else:
    ok["process_set"] = True
errors = {}
for label, call in {"dtype": lambda: hvd.allreduce(mx.nd.ones((2, 2)).tostype("csr")),
                    "root": lambda: hvd.broadcast(x, root_rank=9),
                    "not_ndarray": lambda: hvd.allreduce(np.ones(2))}.items():
    try:
        call()
        errors[label] = "no error"
    except ValueError as exc:
        errors[label] = str(exc)
hvd.barrier()
ok["join"] = hvd.join() in range(n)
report(ok=ok, errors=errors)
'''


@pytest.mark.parametrize("np", [2, 3])
def test_collectives_exact(mxnet_python, np):
    result = hvdrun(COLLECTIVES, np=np, timeout=180, python=mxnet_python).check()
    for rank, got in result.every_rank(np):
        ok, errors = got["ok"], got["errors"]
        assert len(ok) == 22 and all(ok.values()), (rank, ok)
        assert "csr NDArrays are not supported" in errors["dtype"], errors
        assert "root_rank 9 is not a member" in errors["root"], errors
        assert "expected an mx.nd.NDArray" in errors["not_ndarray"], errors


# Horovod's own MXNet test idioms (test/parallel/base_test_mxnet.py): what alltoall returns, the
# exception types its argument errors raise, and parameters broadcast at deferred initialisation.
HOROVOD_IDIOMS = r'''
import mxnet as mx, numpy as np
from mxnet.base import MXNetError
import horovod.mxnet as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
ctx = mx.cpu(0)
checks = {}

vals = []
for i in range(size):
    vals += [i] * (rank + 1)
tensor = mx.ndarray.array(vals, dtype="float32", ctx=ctx)
splits = mx.ndarray.array([rank + 1] * size, dtype="int32", ctx=ctx)
collected, received_splits = hvd.alltoall(tensor, splits)
checks["alltoall_splits"] = (collected.min() == rank and collected.max() == rank
                             and collected.size == size * (size + 1) // 2
                             and received_splits.dtype == np.int32
                             and received_splits.asnumpy().tolist() == [rk + 1 for rk in range(size)])
collected = hvd.alltoall(tensor)  # equal parts of rank + 1 rows each
checks["alltoall_equal_split"] = (isinstance(collected, mx.nd.NDArray) and collected.min() == rank
                                  and collected.max() == rank and collected.size == size * (size + 1) // 2)

def raises(call, types):
    try:
        call()
    except types as exc:
        return type(exc).__name__
    except Exception as exc:  # the wrong type
        return f"wrong type {type(exc).__mro__}: {exc}"
    return "no error"

checks["equal_split_length_error"] = raises(lambda: hvd.alltoall(mx.ndarray.empty([size + 1], ctx=ctx)),
                                            (MXNetError, RuntimeError))
checks["splits_error"] = raises(lambda: hvd.alltoall(mx.ndarray.empty([size - 1], ctx=ctx),
                                                     mx.ndarray.ones([size], dtype="int32", ctx=ctx)),
                                (MXNetError, RuntimeError))
checks["splits_type_error"] = raises(lambda: hvd.alltoall(mx.ndarray.empty([size], ctx=ctx),
                                                          mx.ndarray.ones([size], dtype="float32", ctx=ctx)),
                                     (MXNetError, ValueError))
checks["reducescatter_scalar_error"] = raises(
    lambda: hvd.reducescatter(mx.nd.array(rank, dtype=np.float32, ctx=ctx), op=hvd.Average), ValueError)

# Deferred initialisation: broadcast_parameters before the first forward pass (each rank seeds
# its own initial values, so only the broadcast makes them equal).
mx.random.seed(rank)
layer = mx.gluon.nn.Conv2D(10, 2)
layer.initialize()
hvd.broadcast_parameters(layer.collect_params(), root_rank=0)
layer(mx.nd.ones((5, 4, 10, 10)))
tensors = [p.data() for _, p in sorted(layer.collect_params().items())]
root_tensors = [hvd.broadcast(t, root_rank=0) for t in tensors]
checks["deferred_broadcast"] = all(np.array_equal(t.asnumpy(), root.asnumpy()) for t, root in zip(tensors, root_tensors))
report(checks=checks)
'''


@pytest.mark.parametrize("np", [2, 3])
def test_horovods_mxnet_idioms(mxnet_python, np):
    result = hvdrun(HOROVOD_IDIOMS, np=np, timeout=180, python=mxnet_python).check()
    for rank, got in result.every_rank(np):
        checks = got["checks"]
        assert checks["alltoall_splits"] is True and checks["alltoall_equal_split"] is True, (rank, checks)
        for error in ("equal_split_length_error", "splits_error", "splits_type_error", "reducescatter_scalar_error"):
            assert checks[error] == "ArgumentError", (rank, error, checks[error])
        assert checks["deferred_broadcast"] is True, rank


TRAINING = r'''
import mxnet as mx, numpy as np
import horovod.mxnet as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(0)
X, Y = rng.normal(size=(12, 5)), rng.normal(size=(12, 3))
SHARD = np.arange(12)[r::n]

def make():
    mx.random.seed(0)
    net = mx.gluon.nn.Sequential()
    net.add(mx.gluon.nn.Dense(6, activation="tanh"), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Normal(0.5))
    net.cast("float64")
    net(mx.nd.array(X[:1], dtype="float64"))
    return net

def train(net, trainer, rows, steps=3):
    for _ in range(steps):
        with mx.autograd.record():
            loss = ((net(mx.nd.array(X[rows], dtype="float64")) - mx.nd.array(Y[rows], dtype="float64")) ** 2).sum()
        loss.backward()
        trainer.step(len(rows))
    return [p.data().asnumpy() for _, p in sorted(net.collect_params().items())]

def diff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))

out = {}
for label, optimizer, params, kwargs in (("sgd", "sgd", {"learning_rate": 0.1}, {}),
                                         ("momentum", "sgd", {"learning_rate": 0.1, "momentum": 0.9}, {}),
                                         ("adam", "adam", {"learning_rate": 0.01}, {}),
                                         ("predivide", "sgd", {"learning_rate": 0.1}, {"gradient_predivide_factor": 2.0}),
                                         ("groups", "sgd", {"learning_rate": 0.1}, {"num_groups": 2})):
    ref = make()
    expected = train(ref, mx.gluon.Trainer(ref.collect_params(), optimizer, dict(params), kvstore=None), np.arange(12))
    net = make()
    if r == 1:  # a different start: broadcast_parameters must make rank 0's the one
        for p in net.collect_params().values():
            p.set_data(p.data() + 1)
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    out[label] = diff(expected, train(net, hvd.DistributedTrainer(net.collect_params(), optimizer, dict(params),
                                                                  **kwargs), SHARD))
    # The same with the mx.optimizer wrapper inside a plain Trainer.
    net = make()
    opt = hvd.DistributedOptimizer(mx.optimizer.create(optimizer, rescale_grad=1.0, **params), **kwargs)
    out[label + "_optimizer"] = diff(expected, train(net, mx.gluon.Trainer(net.collect_params(), opt, kvstore=None),
                                                     SHARD))
ref, net = make(), make()
expected = train(ref, mx.gluon.Trainer(ref.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=None), np.arange(12))
trainer = hvd.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, compression=hvd.Compression.fp16)
report(fp16=diff(expected, train(net, trainer, SHARD)), **out)
'''


def test_gluon_training_on_two_ranks_equals_one_process(mxnet_python):
    result = hvdrun(TRAINING, np=2, timeout=180, python=mxnet_python).check()
    for rank, got in result.every_rank(2):
        exact = {k: v for k, v in got.items() if k != "fp16"}
        assert len(exact) == 10 and all(v < 1e-12 for v in exact.values()), (rank, got)
        assert 0 < got["fp16"] < 2e-3, (rank, got)


def test_digits_example_converges(mxnet_python):
    from pathlib import Path

    pytest.importorskip("sklearn")
    import sklearn

    from digits import check_digits_example

    digits = Path(sklearn.__file__).parent / "datasets" / "data" / "digits.csv.gz"
    check_digits_example("mxnet/mxnet_digits.py", "--data", str(digits), "--epochs", "5", python=mxnet_python,
                         min_accuracy=90.0)


def test_argument_errors_have_horovods_types_and_clear_messages_on_every_rank(mxnet_python):
    from argument_errors import check, snippet

    result = hvdrun(snippet(("mxnet",)), np=2, timeout=180, python=mxnet_python).check()
    for rank in (0, 1):
        problems = check(result.ranks[rank]["results"], ("mxnet",))
        assert not problems, f"rank {rank}:\n" + "\n".join(problems)
