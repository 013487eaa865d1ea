"""Collectives on JAX arrays and pytrees, eager and inside `jax.jit`.

Each differentiable collective is one `jax.custom_vjp` node over `horovod.jax._bridge.call`
(numpy now, or one ordered host callback in a trace). Its VJP is the framework-neutral rule of
`horovod.common.collective_rules`, applied with JAX arithmetic by `_JaxGradients`, so
`jax.grad` through a collective runs the collectives Horovod runs for the other frameworks.

`allreduce` and `grouped_allreduce` take a single array or any pytree of arrays: the leaves
travel as one grouped request (negotiated together, fused) and come back in the same tree.

Inside `jit` an output's shape must be known when tracing: allgather assumes every rank has the
same dim 0 and alltoall equal splits (checked when the callback runs, with a clear error);
outside `jit` both take any sizes. `_async` forms run outside `jit` only.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from horovod.common import basics, collective_rules, ops
from horovod.common.gradients import resolve_op
from horovod.common.partition import block_size
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average
from horovod.jax._bridge import Pending, call, checked, host_collective, start
from horovod.jax.compression import Compression, Compressor

__all__ = [
    "allgather", "allgather_async", "allreduce", "allreduce_async", "alltoall", "alltoall_async", "barrier",
    "broadcast", "broadcast_async", "grouped_allgather", "grouped_allgather_async", "grouped_allreduce",
    "grouped_allreduce_async", "grouped_reducescatter", "grouped_reducescatter_async", "join", "poll",
    "reducescatter", "reducescatter_async", "synchronize",
]

Spec = jax.ShapeDtypeStruct


def _members(process_set: ProcessSet) -> list[int]:
    process_set.require_registered()
    return process_set.ranks


def _member_index(process_set: ProcessSet) -> int:
    ranks = _members(process_set)
    if basics.rank() not in ranks:
        raise ValueError(f"rank {basics.rank()} is not a member of {process_set}")
    return ranks.index(basics.rank())


def _differentiable(kind: str, tensors: Sequence[Any], grouped: bool, specs: Callable[[], list[Spec]],
                    backward: Callable[[list[Any]], list[Any]], compression: type[Compressor] = Compression.none,
                    **kwargs: Any) -> list[Any]:
    """Collective `kind` on `tensors` as one custom-VJP node whose input cotangents are
    `backward(output cotangents)`; the tensors travel through `compression`."""
    compressed = [compression.compress(checked(t, kind)) for t in tensors]
    host = host_collective(kind, grouped, **kwargs)

    @jax.custom_vjp
    def node(*xs: Any) -> tuple:
        return tuple(call(host, xs, specs))

    dtypes = [c.dtype for c, _ in compressed]

    def forward(*xs: Any) -> tuple:
        return node(*xs), None

    def cotangents(_: None, gs: tuple) -> tuple:
        # Integer outputs have float0 cotangents; they travel as zeros of their dtype (alltoall's
        # received splits, the one extra output, are dropped by zip).
        grads = backward([g if jnp.issubdtype(d, jnp.inexact) else jnp.zeros(g.shape, d) for g, d in zip(gs, dtypes)])
        return tuple(g if jnp.issubdtype(d, jnp.inexact) else None for g, d in zip(grads, dtypes))

    node.defvjp(forward, cotangents)
    outputs = node(*(c for c, _ in compressed))
    restored = [compression.decompress(out, ctx) for out, (_, ctx) in zip(outputs, compressed)]
    return restored + list(outputs[len(compressed):])  # alltoall's received splits


def _same(tensors: Sequence[Any]) -> Callable[[], list[Spec]]:
    return lambda: [Spec(t.shape, t.dtype) for t in tensors]


def _rows(tensors: Sequence[Any], rows: Callable[[int], int]) -> Callable[[], list[Spec]]:
    """Outputs shaped like the inputs with dim 0 replaced by `rows(dim0)`."""
    return lambda: [Spec((rows(t.shape[0]),) + tuple(t.shape[1:]), t.dtype) for t in tensors]


class _JaxGradients:
    """`collective_rules.GradientCollectives` on JAX arrays: the differentiable collectives of
    this module (unnamed, uncompressed) over `process_set`, so gradients have gradients too."""

    def __init__(self, process_set: ProcessSet, splits_given: bool = True) -> None:
        self.process_set = process_set
        self.splits_given = splits_given

    def allreduce(self, tensors: Sequence[Any], op: int, prescale: float, postscale: float) -> list[Any]:
        return _allreduce(list(tensors), None, Compression.none, op, prescale, postscale, self.process_set,
                          len(tensors) > 1)

    def allgather(self, tensors: Sequence[Any]) -> list[Any]:
        return _allgather(list(tensors), None, self.process_set, grouped=len(tensors) > 1)

    def alltoall(self, tensor: Any, splits: Any) -> Any:
        return _alltoall(tensor, splits if self.splits_given else None, None, self.process_set)[0]

    def average_and_gather_rows(self, tensors: Sequence[Any], inputs: Sequence[int]) -> tuple[list[Any], Any]:
        reduced = self.allreduce(tensors, Average, 1.0, 1.0)
        return reduced, self.allgather([jnp.asarray([list(inputs)], jnp.int32)])[0]

    def rows_before(self, rows: Any, member: int) -> Any:
        return rows[:member].sum(axis=0)

    def narrow(self, tensor: Any, starts: Any, k: int, like: int) -> Any:
        return jax.lax.dynamic_slice_in_dim(tensor, starts[k], like, axis=0)

    def scale(self, tensor: Any, factor: float) -> Any:
        return (tensor * factor).astype(tensor.dtype)

    def zeros_like(self, tensor: Any) -> Any:
        return jnp.zeros_like(tensor)


# -- allreduce (arrays and pytrees) ------------------------------------------------------------------
def _allreduce(tensors: list[Any], name: str | None, compression: type[Compressor], op: int, prescale: float,
               postscale: float, process_set: ProcessSet, grouped: bool) -> list[Any]:
    def backward(gs: list[Any]) -> list[Any]:
        return collective_rules.allreduce_gradient(_JaxGradients(process_set), gs, op, prescale, postscale)

    return _differentiable("allreduce", tensors, grouped, _same(tensors), backward, compression, name=name, op=op,
                           prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)


def allreduce(tensor: Any, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none, op: int | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> Any:
    """Reduced copy of an array, or of every leaf of a pytree in one grouped request (Average by
    default). Differentiable: the VJP is the same allreduce of the output's cotangent."""
    leaves, tree = jax.tree_util.tree_flatten(tensor)
    grouped = len(leaves) != 1 or not isinstance(tensor, (jax.Array, np.ndarray, jax.core.Tracer))
    reduced = _allreduce(leaves, name, compression, resolve_op(op, average), prescale_factor, postscale_factor,
                         process_set, grouped) if leaves else []
    return jax.tree_util.tree_unflatten(tree, reduced)


def grouped_allreduce(tensors: Any, average: bool | None = None, name: str | None = None,
                      compression: type[Compressor] = Compression.none, op: int | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> Any:
    """Reduced copies of a list (or any pytree) of arrays, as one unit that may fuse."""
    leaves, tree = jax.tree_util.tree_flatten(tensors)
    reduced = _allreduce(leaves, name, compression, resolve_op(op, average), prescale_factor, postscale_factor,
                         process_set, grouped=True) if leaves else []
    return jax.tree_util.tree_unflatten(tree, reduced)


# -- allgather ----------------------------------------------------------------------------------------
def _allgather(tensors: list[Any], name: str | None, process_set: ProcessSet, grouped: bool) -> list[Any]:
    tensors = [checked(t, "allgather") for t in tensors]
    dim0 = [t.shape[0] if t.ndim else 1 for t in tensors]
    n = len(_members(process_set))

    def backward(gs: list[Any]) -> list[Any]:
        return collective_rules.allgather_gradient(_JaxGradients(process_set), gs, dim0, _member_index(process_set))

    return _differentiable("allgather", tensors, grouped, _rows(tensors, lambda d: d * n), backward, name=name,
                           process_set=process_set)


def allgather(tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> Any:
    """Every member's `tensor` concatenated along dim 0, in rank order. Differentiable: the VJP is
    the Average-allreduce of the cotangent, cut to this rank's rows."""
    return _allgather([tensor], name, process_set, grouped=False)[0]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """`allgather` of each array of the list, as one unit (differentiable)."""
    return _allgather(list(tensors), name, process_set, grouped=True)


# -- broadcast ----------------------------------------------------------------------------------------
def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    """The root's tensor on every member. Differentiable: the root receives the average of all
    members' cotangents, the others zeros."""

    def backward(gs: list[Any]) -> list[Any]:
        return [collective_rules.broadcast_gradient(_JaxGradients(process_set), gs[0], root_rank, basics.rank())]

    return _differentiable("broadcast", [tensor], False, _same([checked(tensor, "broadcast")]), backward,
                           root_rank=root_rank, name=name, process_set=process_set)[0]


# -- alltoall -----------------------------------------------------------------------------------------
def _splits_list(splits: Any) -> list[int] | None:
    if splits is None:
        return None
    array = np.asarray(splits)
    if array.dtype.kind not in "iu":
        raise ValueError(f"alltoall: splits must hold integers, got {array.dtype}")
    return [int(s) for s in array.reshape(-1)]


def _alltoall(tensor: Any, splits: Any, name: str | None, process_set: ProcessSet) -> list[Any]:
    tensor = checked(tensor, "alltoall")
    split_list = _splits_list(splits)
    n = len(_members(process_set))
    received: list[Any] = []

    def specs() -> list[Spec]:
        return [Spec(tensor.shape, tensor.dtype), Spec((n,), jnp.int32)]

    def backward(gs: list[Any]) -> list[Any]:
        rules = _JaxGradients(process_set, splits_given=split_list is not None)
        return [collective_rules.alltoall_gradient(rules, gs[0], received[0])]

    outputs = _differentiable("alltoall", [tensor], False, specs, backward, splits=split_list, name=name,
                              process_set=process_set)
    received.append(outputs[1])
    return outputs


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Rows scattered to every member (`splits[j]` rows to member j; equal parts when None).
    Returns the received rows, plus the received splits when `splits` is given. Differentiable:
    the cotangent's rows travel back where they came from."""
    output, received = _alltoall(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# -- reducescatter ------------------------------------------------------------------------------------
def _reducescatter(tensors: list[Any], name: str | None, compression: type[Compressor], op: int,
                   process_set: ProcessSet, prescale: float, postscale: float, grouped: bool) -> list[Any]:
    tensors = [checked(t, "reducescatter") for t in tensors]
    n = len(_members(process_set))

    def backward(gs: list[Any]) -> list[Any]:
        return collective_rules.reducescatter_gradient(_JaxGradients(process_set), gs, op, prescale, postscale, n)

    rows = _rows(tensors, lambda d: block_size(d, n, _member_index(process_set)))
    return _differentiable("reducescatter", tensors, grouped, rows, backward, compression, name=name, op=op,
                           prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)


def reducescatter(tensor: Any, name: str | None = None, compression: type[Compressor] = Compression.none,
                  op: int = Average, process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> Any:
    """This member's block of dim 0 of the reduction (Average or Sum). Differentiable: the VJP is
    the allgather of the cotangent (times the set size for Sum)."""
    return _reducescatter([tensor], name, compression, op, process_set, prescale_factor, postscale_factor, False)[0]


def grouped_reducescatter(tensors: Sequence[Any], name: str | None = None,
                          compression: type[Compressor] = Compression.none, op: int = Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[Any]:
    """`reducescatter` of each array of the list, as one unit (differentiable)."""
    return _reducescatter(list(tensors), name, compression, op, process_set, prescale_factor, postscale_factor,
                          True)


# -- async forms (outside jit) -------------------------------------------------------------------------
def allreduce_async(tensor: Any, name: str | None = None, op: int = Average, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> Pending:
    """Start an allreduce of `tensor` (eagerly); `synchronize(handle)` returns the result."""
    return start("allreduce", [tensor], name=name, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor, process_set=process_set)


def grouped_allreduce_async(tensors: Sequence[Any], name: str | None = None, op: int = Average,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Pending:
    """Start reducing a list of arrays as one unit; `synchronize` returns the list."""
    return start("allreduce", tensors, grouped=True, name=name, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor, process_set=process_set)


def allgather_async(tensor: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> Pending:
    """Start gathering every member's `tensor` along dim 0."""
    return start("allgather", [tensor], name=name, process_set=process_set)


def grouped_allgather_async(tensors: Sequence[Any], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Pending:
    """Start an allgather of a list of arrays as one unit."""
    return start("allgather", tensors, grouped=True, name=name, process_set=process_set)


def broadcast_async(tensor: Any, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Pending:
    """Start sending global rank `root_rank`'s `tensor` to every member."""
    return start("broadcast", [tensor], root_rank=root_rank, name=name, process_set=process_set)


def alltoall_async(tensor: Any, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> Pending:
    """`synchronize` returns (received rows, received splits)."""
    return start("alltoall", [tensor], splits=_splits_list(splits), name=name, process_set=process_set)


def reducescatter_async(tensor: Any, name: str | None = None, op: int = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> Pending:
    """Start a reducescatter: each member gets its block of dim 0 of the reduction."""
    return start("reducescatter", [tensor], name=name, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor, process_set=process_set)


def grouped_reducescatter_async(tensors: Sequence[Any], name: str | None = None, op: int = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Pending:
    """Start a reducescatter of a list of arrays as one unit."""
    return start("reducescatter", tensors, grouped=True, name=name, op=op, prescale_factor=prescale_factor,
                 postscale_factor=postscale_factor, process_set=process_set)


def poll(handle: Pending) -> bool:
    """True once the collective behind `handle` finished; never blocks."""
    return handle.poll()


def synchronize(handle: Pending) -> Any:
    """Wait for `handle`'s collective and return its output as JAX arrays."""
    return handle.wait()


# -- control ------------------------------------------------------------------------------------------
def _control(run: Callable[[], int]) -> Any:
    """`run()` through an ordered callback: now outside `jit`, in program order inside it (a
    control op has no array argument that would show whether it is being traced)."""
    result = io_callback(lambda: np.int32(run()), Spec((), jnp.int32), ordered=True)
    return result if isinstance(result, jax.core.Tracer) else int(result)


def join(process_set: ProcessSet = global_process_set) -> Any:
    """This rank has no more data: it contributes zeros to allreduces until every rank joined.
    Returns the global rank that joined last (a traced int32 inside `jit`)."""
    return _control(lambda: ops.run_now(lambda: ops.join_async(process_set)))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every member of the set reached this call (eagerly, or in program order inside `jit`)."""
    _control(lambda: ops.run_now(lambda: ops.barrier_async(process_set)) or 0)
