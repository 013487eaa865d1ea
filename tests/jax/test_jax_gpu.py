"""JAX arrays on a GPU, 2 real ranks sharing one GPU, on both device routes (NCCL and host
staging): every eager collective gives what the same call gives on the CPU, the result is on
the GPU, and the optax DistributedOptimizer averages GPU gradients.

These need a GPU that JAX sees; CI has none, so there they skip, saying so.
scripts/device_check.sh runs them on the device machine (docs/gpu.md).
"""

import os

import pytest

jax = pytest.importorskip("jax")
try:
    jax.devices("gpu")
except RuntimeError:
    pytest.skip("needs a GPU that JAX sees (none here); scripts/device_check.sh runs these on one",
                allow_module_level=True)

from multirank import hvdrun  # noqa: E402

# Each JAX process would otherwise take 75% of the one GPU's memory at its start.
_JAX = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
ROUTES = {
    "nccl": {**_JAX, "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "OWN_NCCL_HOSTID": "1",
             **dict(item.split("=", 1) for item in os.environ.get("KHOROVOD_TEST_NCCL_ENV", "").split())},
    "staged": {**_JAX, "HOROVOD_GPU_OPERATIONS": "MPI"},
}

COLLECTIVES = r'''
import os
if os.environ.get("OWN_NCCL_HOSTID"):
    os.environ["NCCL_HOSTID"] = "khorovod-test-rank-" + os.environ["HOROVOD_RANK"]
import jax, jax.numpy as jnp, numpy as np, optax
import horovod.jax as hvd
from horovod.common import basics

hvd.init()
r, n = hvd.rank(), hvd.size()
gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
bad = []


def both(label, fn, *arrays):
    """`fn` on CPU arrays and on the same arrays on the GPU: equal answers, the GPU's on the GPU."""
    want = fn(*(jax.device_put(a, cpu) for a in arrays))
    got = fn(*(jax.device_put(a, gpu) for a in arrays))
    for w, g in zip(want if isinstance(want, (list, tuple)) else [want], got if isinstance(got, (list, tuple)) else [got]):
        if next(iter(g.devices())).platform != "gpu" and g.dtype != jnp.int32:  # alltoall's splits are host ints
            bad.append(f"{label}: result on {g.devices()}")
        if g.shape != w.shape or g.dtype != w.dtype or not np.array_equal(np.asarray(g), np.asarray(w)):
            bad.append(f"{label}: got {np.asarray(g)!r}, want {np.asarray(w)!r}")


for dt in (jnp.float32, jnp.bfloat16, jnp.int32, jnp.int16):
    k = jnp.dtype(dt).name
    x = (jnp.arange(12).reshape(4, 3) + 3 * r).astype(dt)
    for op in (hvd.Sum, hvd.Min, hvd.Max, hvd.Average):
        both(f"allreduce {k} {op}", lambda t: hvd.allreduce(t, op=op, name=f"ar.{k}.{op}"), x)
    both(f"grouped {k}", lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, name=f"g.{k}"), x, x[0])
    both(f"allgather {k}", lambda t: hvd.allgather(t, name=f"ag.{k}"), x[: r + 1])
    both(f"broadcast {k}", lambda t: hvd.broadcast(t, root_rank=1, name=f"bc.{k}"), x)
    both(f"alltoall {k}", lambda t: hvd.alltoall(t, splits=jnp.array([3, 1] if r == 0 else [1, 3]),
                                                 name=f"a2a.{k}"), x)
    if dt in (jnp.float32, jnp.int32):
        both(f"reducescatter {k}", lambda t: hvd.reducescatter(t, op=hvd.Sum, name=f"rs.{k}"), x)
h = hvd.allreduce_async(jax.device_put(jnp.full(1000, float(r + 1)), gpu), op=hvd.Average)
if not np.array_equal(np.asarray(hvd.synchronize(h)), np.full(1000, 1.5)):
    bad.append("allreduce_async Average")

opt = hvd.DistributedOptimizer(optax.sgd(0.1))
params = {"w": jax.device_put(jnp.ones(4), gpu)}
updates, _ = opt.update({"w": jax.device_put(jnp.full(4, float(r + 1)), gpu)}, opt.init(params), params)
if not np.allclose(np.asarray(updates["w"]), -0.15):
    bad.append(f"DistributedOptimizer: {np.asarray(updates['w'])}")
device = basics.runtime().engine.cycle.executor.device
report(bad=bad, routes={str(list(g)): why for g, why in device.routes.items()})
'''


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_jax_gpu_arrays_through_every_collective(route):
    result = hvdrun(COLLECTIVES, np=2, env=ROUTES[route], timeout=240).check()
    for rank in (0, 1):
        assert result.ranks[rank]["bad"] == [], result.ranks[rank]["bad"]
    assert result.ranks[0]["routes"] == ({"[0, 1]": ""} if route == "nccl" else {}), result.ranks[0]["routes"]
