"""Data-parallel training of a small MLP in pure JAX + optax on scikit-learn's bundled digits.

Nothing to download: the 1,797 8x8 images ship inside scikit-learn. Each rank trains on its own
shard; `hvd.DistributedOptimizer` averages the gradients inside the jitted step.

    horovodrun -np 2 python examples/jax/jax_digits.py
    python examples/jax/jax_digits.py            # one process works too
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits

import horovod.jax as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Horovod + JAX on scikit-learn's digits")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3, help="per rank; scaled by the number of ranks")
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    parser.add_argument("--backward-passes-per-step", type=int, default=1,
                        help="average this many batches locally before each allreduce")
    return parser.parse_args()


def init_params(key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (64, 128)) * 0.1, "b1": jnp.zeros(128),
            "w2": jax.random.normal(k2, (128, 10)) * 0.1, "b2": jnp.zeros(10)}


def logits(params: dict, x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y).mean()


def main() -> None:
    args = parse_args()
    hvd.init()
    images, labels = load_digits(return_X_y=True)
    x, y = images.astype(np.float32) / 16.0, labels.astype(np.int32)
    order = np.random.default_rng(42).permutation(len(y))  # the same split on every rank
    test, train = order[:300], order[300:]
    shard = train[hvd.rank()::hvd.size()]

    # Every rank starts from rank 0's parameters (a different seed elsewhere shows it matters).
    params = hvd.broadcast_parameters(init_params(jax.random.PRNGKey(hvd.rank())), root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    tx = hvd.DistributedOptimizer(optax.adam(args.lr * hvd.size()), compression=compression,
                                  backward_passes_per_step=args.backward_passes_per_step)
    opt_state = tx.init(params)

    @jax.jit
    def step(params: dict, opt_state: optax.OptState, xb: jax.Array, yb: jax.Array) -> tuple:
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    steps = int(hvd.allreduce(jnp.asarray([len(shard) // args.batch_size]), op=hvd.Min)[0])  # same everywhere
    rng = np.random.default_rng(hvd.rank())
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        rng.shuffle(shard)
        losses = []
        for i in range(steps):
            batch = shard[i * args.batch_size:(i + 1) * args.batch_size]
            params, opt_state, loss = step(params, opt_state, x[batch], y[batch])
            losses.append(loss)
        mean_loss = float(hvd.allreduce(jnp.mean(jnp.stack(losses)), name="loss"))
        if hvd.rank() == 0 and (epoch % 5 == 0 or epoch == 1):
            print(f"epoch {epoch:3d}  loss {mean_loss:.4f}", flush=True)
    accuracy = float((logits(params, x[test]).argmax(1) == y[test]).mean())
    same = hvd.allgather_object(float(jnp.sum(params["w1"])))
    if hvd.rank() == 0:
        print(f"final test accuracy {100 * accuracy:.1f}% on {hvd.size()} rank(s) in "
              f"{time.perf_counter() - start:.1f}s; all ranks hold the same model: {len(set(same)) == 1}")


if __name__ == "__main__":
    main()
