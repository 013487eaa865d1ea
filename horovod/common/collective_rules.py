"""What each collective means, independent of the framework: stated once, applied by every bridge.

A framework adapter (torch, TensorFlow, later JAX and MXNet) moves its tensors to host buffers and
back; everything else about a collective is the same everywhere and lives here:

* `CORE_CALLS`: the core functions that run a collective, in its single and grouped form;
* `KEEPS_SHAPE`: the collectives whose output has the input's shape (a reducescatter member's rows
  are `horovod.common.partition.block_size`; allgather's and alltoall's depend on the others);
* the gradient of each collective, written as other collectives (`*_gradient`). A bridge supplies
  those collectives and a little arithmetic on its own tensors through `GradientCollectives`;
* sparse allreduce: which ops can combine gathered (indices, values) pairs.

The dtypes a collective moves are `horovod.common.reduce_ops.DTYPE_NAMES`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, TypeVar

from horovod.common import ops
from horovod.common.reduce_ops import Average, Sum

T = TypeVar("T")

CORE_CALLS: dict[str, tuple[Callable[..., ops.Handle], Callable[..., ops.Handle] | None]] = {
    # kind -> (single-tensor core call, list core call)
    "allreduce": (ops.allreduce_async, ops.grouped_allreduce_async),
    "allgather": (ops.allgather_async, ops.grouped_allgather_async),
    "broadcast": (ops.broadcast_async, None),
    "alltoall": (ops.alltoall_async, None),
    "reducescatter": (ops.reducescatter_async, ops.grouped_reducescatter_async),
}

# Sparse tensors are reduced by gathering every member's (indices, values): only sums (and their
# average, the values divided by the set size) survive that; Min, Max or Product need dense tensors.
SPARSE_OPS = (Average, Sum)


# Collectives whose output has exactly the input's shape on every member.
KEEPS_SHAPE = frozenset({"allreduce", "broadcast"})


class GradientCollectives(Protocol[T]):
    """The collectives and arithmetic a gradient rule needs, on one framework's tensors.

    A bridge builds one per differentiated op, so that it already knows the op's process set,
    name and grouping; the rules below only say which collective to run on what."""

    def allreduce(self, tensors: Sequence[T], op: int, prescale: float, postscale: float) -> list[T]:
        """`tensors` reduced with `op` over the set."""

    def allgather(self, tensors: Sequence[T]) -> list[T]:
        """`tensors` concatenated along dim 0 over the set."""

    def alltoall(self, tensor: T, splits: T) -> T:
        """`tensor`'s rows sent back as `splits` says (the splits a forward alltoall received)."""

    def average_and_gather_rows(self, tensors: Sequence[T], inputs: Sequence[Any]) -> tuple[list[T], T]:
        """The Average-allreduce of `tensors`, and every member's dim 0 of each input: a
        [members x len(inputs)] integer tensor (both may travel in one round)."""

    def rows_before(self, rows: T, member: int) -> Any:
        """Per input, the rows that the members before `member` contributed (a sum over `rows`)."""

    def narrow(self, tensor: T, starts: Any, k: int, like: Any) -> T:
        """Input k's part of `tensor`: from `starts[k]`, as many rows as input `like` has."""

    def scale(self, tensor: T, factor: float) -> T:
        """`tensor` times `factor`, in its own dtype."""

    def zeros_like(self, tensor: T) -> T:
        """Zeros of `tensor`'s shape and dtype."""


def allreduce_gradient(collectives: GradientCollectives[T], grads: Sequence[T], op: int, prescale: float,
                       postscale: float) -> list[T]:
    """allreduce: every output depends on every input through the same sum, so the gradient is the
    same allreduce of the output gradients."""
    return collectives.allreduce(grads, op, prescale, postscale)


def allgather_gradient(collectives: GradientCollectives[T], grads: Sequence[T], inputs: Sequence[Any],
                       member: int) -> list[T]:
    """allgather: the Average-allreduce of the output gradients, cut to the rows this member gave."""
    reduced, rows = collectives.average_and_gather_rows(grads, inputs)
    starts = collectives.rows_before(rows, member)
    return [collectives.narrow(r, starts, k, x) for k, (r, x) in enumerate(zip(reduced, inputs))]


def broadcast_gradient(collectives: GradientCollectives[T], grad: T, root_rank: int, rank: int) -> T:
    """broadcast: the root receives the average of every member's output gradient, the others zeros."""
    reduced = collectives.allreduce([grad], Average, 1.0, 1.0)[0]
    return reduced if rank == root_rank else collectives.zeros_like(reduced)


def reducescatter_gradient(collectives: GradientCollectives[T], grads: Sequence[T], op: int, prescale: float,
                           postscale: float, set_size: int) -> list[T]:
    """reducescatter: the allgather of the output gradients. A Sum spreads each input row to every
    member, so its gradient counts set-size times (Horovod's convention), times the scaling."""
    factor = prescale * postscale * (set_size if op == Sum else 1)
    gathered = collectives.allgather(grads)
    return [collectives.scale(g, factor) if factor != 1 else g for g in gathered]


def alltoall_gradient(collectives: GradientCollectives[T], grad: T, received_splits: T) -> T:
    """alltoall: the output gradient's rows go back where they came from, with the received splits."""
    return collectives.alltoall(grad, received_splits)


def sparse_values_factor(op: int, factor: float, set_size: int) -> float:
    """What the gathered values of a sparse allreduce are multiplied by: the scaling, divided by the
    set size for Average."""
    return factor / set_size if op == Average else factor
