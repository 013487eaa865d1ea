"""DistributedOptimizer for optax: gradients averaged across ranks before the wrapped update.

`DistributedOptimizer(optax.adam(1e-3))` is an `optax.GradientTransformation` like the one it
wraps: `init` is the wrapped one's, and `update` first reduces the gradient pytree across ranks
(one request per step, negotiated together and fused; as a host callback when the step is
jitted) with the options of `horovod.common.gradients.GradientReducer`, then calls the wrapped
`update`. With `backward_passes_per_step=k` the gradients of k calls are summed locally and
only every k-th call reduces their mean and updates (the other calls return zero updates).
That call runs in one branch of a `lax.cond`, so the collective runs only when it is taken; not
`optax.MultiSteps`, which evaluates the wrapped update (and so the allreduce) on every call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from horovod.common import ops
from horovod.common.device.buffers import Buffer
from horovod.common.gradients import GradientReducer, Plan
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average
from horovod.jax._bridge import call
from horovod.jax.compression import Compression, Compressor

__all__ = ["DistributedOptimizer", "allreduce_gradients"]


def _transport(reducer: GradientReducer, tensors: list[Any], plan: Plan) -> list[Any]:
    def reduce_arrays(arrays: list[Buffer]) -> list[Buffer]:
        return ops.submit_waited(reducer.submit, arrays, plan)()

    return call(reduce_arrays, tensors, lambda: [jax.ShapeDtypeStruct(t.shape, t.dtype) for t in tensors])


def allreduce_gradients(reducer: GradientReducer, grads: Any) -> Any:
    """The pytree `grads` reduced across ranks as `reducer` says (same tree structure)."""
    leaves, tree = jax.tree_util.tree_flatten(grads)
    reduced = reducer.reduce(leaves, [None] * len(leaves), lambda ts, plan: _transport(reducer, ts, plan),
                             lambda g, factor: g * factor)
    return jax.tree_util.tree_unflatten(tree, reduced)


class AccumulationState(NamedTuple):
    """The gradients summed over the calls of the current step, and the wrapped optimizer's state."""

    mini_step: Any
    summed: Any
    inner: Any


def _accumulating(optimizer: optax.GradientTransformation, passes: int) -> optax.GradientTransformation:
    """`optimizer` updating every `passes`-th call, with the mean of those calls' gradients."""

    def init(params: Any) -> AccumulationState:
        return AccumulationState(jnp.zeros([], jnp.int32), jax.tree_util.tree_map(jnp.zeros_like, params),
                                 optimizer.init(params))

    def update(grads: Any, state: AccumulationState, params: Any = None) -> tuple[Any, AccumulationState]:
        summed = jax.tree_util.tree_map(jnp.add, state.summed, grads)

        def step(_: None) -> tuple[Any, AccumulationState]:
            mean = jax.tree_util.tree_map(lambda g: (g / passes).astype(g.dtype), summed)
            updates, inner = optimizer.update(mean, state.inner, params)
            return updates, AccumulationState(jnp.zeros([], jnp.int32),
                                              jax.tree_util.tree_map(jnp.zeros_like, summed), inner)

        def accumulate(_: None) -> tuple[Any, AccumulationState]:
            return (jax.tree_util.tree_map(jnp.zeros_like, grads),
                    AccumulationState(state.mini_step + 1, summed, state.inner))

        return jax.lax.cond(state.mini_step == passes - 1, step, accumulate, None)

    return optax.GradientTransformation(init, update)


def DistributedOptimizer(optimizer: optax.GradientTransformation, name: str | None = None,
                         compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0, groups: int | None = None,
                         process_set: ProcessSet = global_process_set) -> optax.GradientTransformation:
    """`optimizer` with its gradients reduced across the ranks of `process_set` first.

    `op`: Average (default) or Sum; `compression`: `Compression.fp16`/`.bf16` halve the bytes;
    `groups`: how many grouped requests the gradients are split into (0/None: one per leaf,
    all still negotiated together); `backward_passes_per_step`: see the module docstring."""
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)):
        raise ValueError("groups: horovod.jax takes the number of groups (an integer); arrays have no identity "
                         "to list them by")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a positive integer, got {backward_passes_per_step!r}")
    reducer = GradientReducer(name or "DistributedOptimizer", op, gradient_predivide_factor, groups=groups,
                              process_set=process_set, compression=compression)

    def update(grads: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        return optimizer.update(allreduce_gradients(reducer, grads), state, params)

    wrapped = optax.GradientTransformation(optimizer.init, update)
    if backward_passes_per_step == 1:
        return wrapped
    return _accumulating(wrapped, backward_passes_per_step)
