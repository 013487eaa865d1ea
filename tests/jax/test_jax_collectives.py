"""horovod.jax collectives on real ranks: exact results eagerly and inside jax.jit, pytrees in one
request, the VJP rules of the shared table, async handles, objects, process sets, bad input."""

import pytest

pytest.importorskip("jax")

from multirank import hvdrun  # noqa: E402

COLLECTIVES = r'''
import jax, jax.numpy as jnp, numpy as np
import horovod.jax as hvd

jax.config.update("jax_enable_x64", True)
hvd.init()
r, n = hvd.rank(), hvd.size()
x = jnp.arange(6.0).reshape(3, 2) + r
total = sum(np.arange(6.0).reshape(3, 2) + k for k in range(n))
ok = {}
for mode, wrap in (("eager", lambda f: f), ("jit", jax.jit)):
    ok[f"avg_{mode}"] = np.allclose(wrap(hvd.allreduce)(x), total / n)
    ok[f"sum_{mode}"] = np.array_equal(wrap(lambda v: hvd.allreduce(v, op=hvd.Sum))(x), total)
    ok[f"minmax_{mode}"] = (np.array_equal(wrap(lambda v: hvd.allreduce(v, op=hvd.Min))(x), x - r)
                            and np.array_equal(wrap(lambda v: hvd.allreduce(v, op=hvd.Max))(x), x - r + n - 1))
    ok[f"product_{mode}"] = np.array_equal(wrap(lambda v: hvd.allreduce(v, op=hvd.Product))(jnp.full(2, r + 1.0)),
                                           np.full(2, float(np.prod(np.arange(1, n + 1)))))
    ok[f"scaled_{mode}"] = np.allclose(wrap(lambda v: hvd.allreduce(v, op=hvd.Sum, prescale_factor=2.0,
                                                                    postscale_factor=0.25))(x), total / 2)
    tree = wrap(hvd.allreduce)({"w": x, "b": [jnp.ones(3, jnp.int32) * r]})
    ok[f"pytree_{mode}"] = (np.allclose(tree["w"], total / n) and tree["b"][0].dtype == jnp.int32
                            and np.array_equal(tree["b"][0], np.full(3, sum(range(n)) // n)))
    grouped = wrap(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum))(x, jnp.ones(4, jnp.bfloat16))
    ok[f"grouped_{mode}"] = np.array_equal(grouped[0], total) and grouped[1].dtype == jnp.bfloat16 \
        and np.array_equal(grouped[1].astype(np.float32), np.full(4, n))
    ok[f"allgather_{mode}"] = np.array_equal(wrap(hvd.allgather)(x), np.concatenate([x - r + k for k in range(n)]))
    ok[f"broadcast_{mode}"] = np.array_equal(wrap(lambda v: hvd.broadcast(v, n - 1))(x), x - r + n - 1)
    ok[f"alltoall_{mode}"] = np.array_equal(wrap(hvd.alltoall)(jnp.arange(n) + 10 * r), 10 * np.arange(n) + r)
    ok[f"reducescatter_{mode}"] = np.array_equal(wrap(lambda v: hvd.reducescatter(v, op=hvd.Sum))(jnp.arange(7.0)),
                                                 n * np.array_split(np.arange(7.0), n)[r])
    gr = wrap(lambda a, b: hvd.grouped_reducescatter([a, b]))(jnp.arange(7.0), jnp.ones((n, 2)))
    ok[f"grouped_reducescatter_{mode}"] = np.allclose(gr[0], np.array_split(np.arange(7.0), n)[r]) \
        and np.allclose(gr[1], np.ones((1, 2)))
    ga = wrap(lambda a, b: hvd.grouped_allgather([a, b]))(x, jnp.ones(2) * r)
    ok[f"grouped_allgather_{mode}"] = ga[0].shape == (3 * n, 2) and np.array_equal(ga[1], np.repeat(np.arange(n), 2))
# Outside jit, sizes may differ per rank.
ragged = hvd.allgather(jnp.full((r + 1, 2), r))
ok["allgather_ragged"] = np.array_equal(ragged, np.concatenate([np.full((k + 1, 2), k) for k in range(n)]))
splits = [(r + j) % 2 + 1 for j in range(n)]
rows, received = hvd.alltoall(jnp.arange(sum(splits)) + 100 * r, splits=splits)
ok["alltoall_splits"] = list(received) == [(k + r) % 2 + 1 for k in range(n)] and len(rows) == sum(received)
# Async handles, objects, parameter pytrees, barrier and join.
ok["async"] = np.array_equal(hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum)), total)
handle = hvd.grouped_allgather_async([x, x])
ok["poll"] = isinstance(hvd.poll(handle), bool) and len(hvd.synchronize(handle)) == 2
ok["objects"] = hvd.broadcast_object({"from": r}, root_rank=1) == {"from": 1} and hvd.allgather_object(r) == list(range(n))
params = hvd.broadcast_parameters({"w": x, "b": jnp.full(2, r)}, root_rank=0)
ok["broadcast_parameters"] = np.array_equal(params["w"], x - r) and np.array_equal(params["b"], np.zeros(2))
hvd.barrier()
ok["barrier_in_jit"] = np.array_equal(jax.jit(lambda v: (hvd.barrier(), v + 1)[1])(x), x + 1)
ok["join"] = hvd.join() in range(n)
ok["join_in_jit"] = int(jax.jit(lambda: hvd.join())()) in range(n)
report(**ok)
'''


@pytest.mark.parametrize("np", [3])  # 2 ranks: the training tests; 3 makes reducescatter's blocks uneven
def test_collectives_exact_eager_and_jit(np):
    result = hvdrun(COLLECTIVES, np=np, timeout=180).check()
    for rank in range(np):
        got = result.ranks[rank]
        assert len(got) == 2 * 13 + 9 and all(got.values()), (rank, got)


GRADIENTS = r'''
import jax, jax.numpy as jnp, numpy as np
import horovod.jax as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
x = jnp.arange(6.0).reshape(3, 2) + r
w = jnp.arange(3.0 * n)[:, None]
out = {}
for mode, wrap in (("eager", lambda f: f), ("jit", jax.jit)):
    out[f"allreduce_{mode}"] = wrap(jax.grad(lambda v: (hvd.allreduce(v) ** 2).sum()))(x)
    out[f"allgather_{mode}"] = wrap(jax.grad(lambda v: (hvd.allgather(v) * w).sum()))(x)
    out[f"broadcast_{mode}"] = wrap(jax.grad(lambda v: hvd.broadcast(v, 0).sum()))(x)
    out[f"reducescatter_{mode}"] = wrap(jax.grad(lambda v: hvd.reducescatter(v, op=hvd.Sum).sum()))(jnp.ones(2 * n))
    out[f"alltoall_{mode}"] = wrap(jax.grad(lambda v: (hvd.alltoall(v) * (1 + r)).sum()))(jnp.ones(n))
    out[f"grouped_{mode}"] = wrap(jax.grad(lambda t: sum(y.sum() for y in hvd.grouped_allreduce(t, op=hvd.Sum))))(
        [x, jnp.ones(2)])
report(**out)
'''


def test_gradients_follow_the_shared_rules():
    n = 3
    result = hvdrun(GRADIENTS, np=n, timeout=180).check()
    import numpy as np

    xs = [np.arange(6.0).reshape(3, 2) + k for k in range(n)]
    for rank in range(n):
        got = {k: v if k.startswith("grouped") else np.asarray(v) for k, v in result.ranks[rank].items()}
        for mode in ("eager", "jit"):
            # d/dx sum(mean(x)^2): the allreduce (Average) of 2 * mean.
            assert np.allclose(got[f"allreduce_{mode}"], 2 * sum(xs) / n)
            # allgather: this rank's rows of the (averaged) cotangent, the weights.
            assert np.allclose(got[f"allgather_{mode}"], np.repeat(np.arange(3.0 * rank, 3.0 * rank + 3)[:, None], 2, 1))
            assert np.allclose(got[f"broadcast_{mode}"], np.ones((3, 2)) if rank == 0 else 0)
            assert np.allclose(got[f"reducescatter_{mode}"], np.full(2 * n, n))  # Sum: set size times
            # alltoall: element j went to member j, whose cotangent is 1 + j.
            assert np.allclose(got[f"alltoall_{mode}"], 1 + np.arange(n))
            assert all(np.allclose(g, n) for g in got[f"grouped_{mode}"])


ERRORS = r'''
import jax, jax.numpy as jnp, numpy as np
import horovod.jax as hvd

evens = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[evens])
r = hvd.rank()
errors = {}
for label, call in {
    "dtype": lambda: hvd.allreduce(jnp.ones(2, jnp.complex64)),
    "root": lambda: hvd.broadcast(jnp.ones(2), root_rank=7),
    "async_in_jit": lambda: jax.jit(lambda v: hvd.synchronize(hvd.allreduce_async(v)))(jnp.ones(2)),
    "groups": lambda: hvd.DistributedOptimizer(__import__("optax").sgd(0.1), groups=[[1]]),
    "unregistered": lambda: hvd.allreduce(jnp.ones(2), process_set=hvd.ProcessSet([0])),
}.items():
    try:
        call()
        errors[label] = "no error"
    except ValueError as exc:
        errors[label] = str(exc)
# Unequal dim 0 inside jit: a clear error on every rank, never a hang.
try:
    jax.jit(hvd.allgather)(jnp.ones((1 if r == 0 else 2, 2))).block_until_ready()
    errors["ragged_jit"] = "no error"
except Exception as exc:
    errors["ragged_jit"] = str(exc)
# Process sets: a sub-set's collectives, eager and traced.
if r in (0, 2):
    errors["set_sum"] = float(jax.jit(lambda v: hvd.allreduce(v, op=hvd.Sum, process_set=evens))(jnp.ones(1) * r)[0])
hvd.barrier()
report(**errors)
'''


def test_bad_input_fails_clearly_on_every_rank_and_process_sets_work():
    result = hvdrun(ERRORS, np=3, timeout=180).check()
    for rank in range(3):
        got = result.ranks[rank]
        assert "complex64 is not supported" in got["dtype"], got
        assert "root_rank 7 is not a member" in got["root"], got
        assert "cannot run inside jax.jit" in got["async_in_jit"], got
        assert "number of groups" in got["groups"], got
        assert "is not registered" in got["unregistered"], got
        assert "same" in got["ragged_jit"] and "dim 0" in got["ragged_jit"], got
        if rank in (0, 2):
            assert got["set_sum"] == 2.0
