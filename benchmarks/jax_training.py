"""Training throughput: horovod.jax's DistributedOptimizer against jax.distributed (gloo on CPU).

    horovodrun -np 2 python benchmarks/jax_training.py

Both run in the same job on the same ranks, on the same MLP, batches and optimizer (SGD with
momentum), the step jitted in both. khorovod: each rank jits its own step and the optax wrapper
averages the gradients through the engine (one ordered host callback per step). jax.distributed:
one global program over every rank's CPU device, the batch sharded across them and the
parameters replicated, so XLA inserts the gradient allreduce (gloo collectives). The two
alternate in rounds, swapping who goes first, so the load of a shared machine hits both alike;
the script prints the median steps/s of each and the ratio. The final weights must agree: the
mean over the global batch is the average of the per-rank means (equal batches).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

import jax

import horovod.jax as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8, help="hidden layers")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round and contender")
    return parser.parse_args()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    args = parse_args()
    hvd.init()
    # jax.distributed must start before JAX touches a device: the coordinator is rank 0.
    port = hvd.broadcast_object(free_port() if hvd.rank() == 0 else None, root_rank=0, name="port")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=hvd.size(), process_id=hvd.rank())

    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    sizes = [256] + [args.width] * args.layers + [10]
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes) - 1)
    init = [(jax.random.normal(k, (a, b)) / np.sqrt(a), jnp.zeros(b)) for k, a, b in zip(keys, sizes, sizes[1:])]
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(args.batch_size, 256)).astype(np.float32)
    y = rng.normal(size=(args.batch_size, 10)).astype(np.float32)

    def loss_fn(params: list, xb: jax.Array, yb: jax.Array) -> jax.Array:
        h = xb
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        return ((h @ params[-1][0] + params[-1][1] - yb) ** 2).mean()

    def make_step(tx: optax.GradientTransformation, **jit_kwargs: object):
        def step(params: list, state: optax.OptState, xb: jax.Array, yb: jax.Array) -> tuple:
            updates, state = tx.update(jax.grad(loss_fn)(params, xb, yb), state, params)
            return optax.apply_updates(params, updates), state
        return jax.jit(step, **jit_kwargs)

    # khorovod: a local program per rank.
    hvd_tx = hvd.DistributedOptimizer(optax.sgd(0.01, momentum=0.9))
    local = jax.local_devices()[0]
    hvd_state = [jax.device_put(init, local)]
    hvd_state.append(hvd_tx.init(hvd_state[0]))
    hvd_step = make_step(hvd_tx)
    hvd_batch = (jax.device_put(x, local), jax.device_put(y, local))

    # jax.distributed: one global program; batch sharded over the ranks' devices, parameters replicated.
    mesh = Mesh(np.array(jax.devices()), ("d",))
    replicated, sharded = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("d"))
    jd_tx = optax.sgd(0.01, momentum=0.9)
    jd_params = jax.tree_util.tree_map(lambda a: jax.make_array_from_process_local_data(replicated, np.asarray(a)),
                                       init)
    jd_state = [jd_params, jax.jit(jd_tx.init, out_shardings=replicated)(jd_params)]
    jd_step = make_step(jd_tx, out_shardings=(replicated, replicated))
    jd_batch = (jax.make_array_from_process_local_data(sharded, x), jax.make_array_from_process_local_data(sharded, y))

    def run(which: str, steps: int) -> float:
        step, state, batch = (hvd_step, hvd_state, hvd_batch) if which == "khorovod" else (jd_step, jd_state, jd_batch)
        start = time.perf_counter()
        for _ in range(steps):
            state[0], state[1] = step(state[0], state[1], *batch)
        jax.block_until_ready(state[0])
        return steps / (time.perf_counter() - start)

    for which in ("khorovod", "jax.distributed"):  # compile and warm up
        run(which, 2)
    rates: dict[str, list[float]] = {"khorovod": [], "jax.distributed": []}
    for i in range(args.rounds):
        for which in (("khorovod", "jax.distributed") if i % 2 == 0 else ("jax.distributed", "khorovod")):
            rates[which].append(run(which, args.steps))
    ratios = [a / b for a, b in zip(rates["khorovod"], rates["jax.distributed"])]
    gap = max(float(np.abs(np.asarray(a) - np.asarray(b.addressable_data(0))).max())
              for a, b in zip(jax.tree_util.tree_leaves(hvd_state[0]), jax.tree_util.tree_leaves(jd_state[0])))
    if hvd.rank() == 0:
        count = sum(a * b + b for a, b in zip(sizes, sizes[1:]))
        print(f"mlp {args.layers}x{args.width}: {count / 1e6:.1f} M params, batch {args.batch_size}/rank, "
              f"{hvd.size()} ranks, {args.rounds} rounds of {args.steps} steps")
        for which, values in rates.items():
            print(f"{which:16s} median {statistics.median(values):7.2f} steps/s  "
                  f"({', '.join(f'{v:.2f}' for v in values)})")
        print(f"ratio of medians (khorovod / jax.distributed): "
              f"{statistics.median(rates['khorovod']) / statistics.median(rates['jax.distributed']):.2f}; "
              f"median per-round ratio {statistics.median(ratios):.2f}")
        print(f"largest weight difference after training: {gap:.2e}")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
