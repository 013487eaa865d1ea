"""The data-parallel identity on JAX: N ranks with the optax DistributedOptimizer on disjoint
shards end with the parameters one process gets on the whole batch (jitted steps)."""

import pytest

pytest.importorskip("optax")

from multirank import hvdrun  # noqa: E402

IDENTITY = r'''
import jax, jax.numpy as jnp, numpy as np, optax
import horovod.jax as hvd

jax.config.update("jax_enable_x64", True)
hvd.init()
r, n = hvd.rank(), hvd.size()
rng = np.random.default_rng(0)
X, Y = jnp.asarray(rng.normal(size=(12, 5))), jnp.asarray(rng.normal(size=(12, 3)))
SHARD = np.arange(12)[r::n]

def init():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"w1": jax.random.normal(k1, (5, 6), jnp.float64), "b1": jnp.zeros(6),
            "w2": jax.random.normal(k2, (6, 3), jnp.float64), "b2": jnp.zeros(3)}

def loss(p, rows):  # mean squared error over `rows`
    h = jnp.tanh(X[rows] @ p["w1"] + p["b1"])
    return ((h @ p["w2"] + p["b2"] - Y[rows]) ** 2).sum(axis=1).mean()

def train(tx, batches):
    params = init() if r == 0 else jax.tree_util.tree_map(lambda a: a + 1.0, init())  # rank 0's win
    params = hvd.broadcast_parameters(params, root_rank=0)
    state = tx.init(params)

    @jax.jit
    def step(params, state, rows):
        grads = jax.grad(loss)(params, rows)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    for rows in batches:
        params, state = step(params, state, jnp.asarray(rows))
    return params

def compare(label, make, passes=1, ref_tx=None, **kwargs):
    ref = train(ref_tx or make(), [np.arange(12)] * 3)
    micro = [part for _ in range(3) for part in np.array_split(SHARD, passes)]
    dist = train(hvd.DistributedOptimizer(make(), backward_passes_per_step=passes, **kwargs), micro)
    report(**{label: max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(ref),
                                                                       jax.tree_util.tree_leaves(dist)))})

compare("sgd", lambda: optax.sgd(0.1))
compare("momentum", lambda: optax.sgd(0.1, momentum=0.9))
compare("adam", lambda: optax.adam(0.01))
compare("momentum_passes", lambda: optax.sgd(0.1, momentum=0.9), passes=2)
compare("sgd_groups", lambda: optax.sgd(0.1), groups=2)
compare("sgd_predivide", lambda: optax.sgd(0.1), gradient_predivide_factor=2.0)
compare("sgd_sum", lambda: optax.sgd(0.1 / n), op=hvd.Sum, ref_tx=optax.sgd(0.1))  # Sum: n times the mean
compare("fp16", lambda: optax.sgd(0.1), compression=hvd.Compression.fp16)
compare("bf16", lambda: optax.sgd(0.1), compression=hvd.Compression.bf16)
'''


@pytest.mark.parametrize("np", [2])
def test_n_ranks_equal_one_process_on_the_whole_batch(np):
    result = hvdrun(IDENTITY, np=np, timeout=180).check()
    for rank in range(np):
        got = result.ranks[rank]
        exact = {k: v for k, v in got.items() if k not in ("fp16", "bf16")}
        assert len(exact) == 7 and all(v < 1e-12 for v in exact.values()), (rank, got)
        assert got["fp16"] < 2e-3 and got["bf16"] < 2e-2, (rank, got)


def test_digits_example_converges_and_only_rank_zero_prints():
    from digits import check_digits_example

    check_digits_example("jax/jax_digits.py", "--epochs", "5", "--backward-passes-per-step", "2")
