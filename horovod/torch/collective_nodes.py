"""Horovod's torch autograd nodes, under its names and with its `forward` arguments.

Scripts apply them directly (`HorovodAllreduce.apply(tensor, average, name, op, prescale_factor,
postscale_factor, process_set)`), and `horovod.torch.mpi_ops`' differentiable collectives are
these nodes. Each runs the blocking collective forward and applies the framework-neutral gradient
rule of `horovod.common.collective_rules` backward, through `TorchGradients`: the same nodes, so
gradients have gradients too.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from horovod.common import basics, collective_rules
from horovod.common.gradients import resolve_op
from horovod.common.process_sets import ProcessSet
from horovod.common.reduce_ops import Average
from horovod.torch._bridge import members, run
from horovod.torch.compression import Compressor

__all__ = ["HorovodAllgather", "HorovodAllreduce", "HorovodAlltoall", "HorovodBroadcast", "HorovodGroupedAllgather",
           "HorovodGroupedAllreduce", "HorovodGroupedReducescatter", "HorovodReducescatter", "TorchGradients",
           "compressed", "splits_list"]


class HorovodAllreduce(torch.autograd.Function):
    """allreduce; the gradient is the same allreduce of the output's gradient."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, average: bool | None, name: str | None, op: int | None,
                prescale_factor: float, postscale_factor: float, process_set: ProcessSet) -> torch.Tensor:
        ctx.op, ctx.scale, ctx.process_set = resolve_op(op, average), (prescale_factor, postscale_factor), process_set
        return run("allreduce", [tensor], name=name, op=ctx.op, prescale_factor=prescale_factor,
                   postscale_factor=postscale_factor, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (reduced,) = collective_rules.allreduce_gradient(TorchGradients(ctx.process_set, grouped=False),
                                                         [grad.contiguous()], ctx.op, *ctx.scale)
        return reduced, None, None, None, None, None, None


class HorovodGroupedAllreduce(torch.autograd.Function):
    """grouped_allreduce; each gradient is the allreduce of its output's gradient, as one group."""

    @staticmethod
    def forward(ctx: Any, average: bool | None, name: str | None, op: int | None, prescale_factor: float,
                postscale_factor: float, process_set: ProcessSet, *tensors: torch.Tensor) -> tuple:
        ctx.op, ctx.scale, ctx.process_set = resolve_op(op, average), (prescale_factor, postscale_factor), process_set
        return tuple(run("allreduce", tensors, grouped=True, name=name, op=ctx.op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        reduced = collective_rules.allreduce_gradient(TorchGradients(ctx.process_set), _contiguous(grads), ctx.op,
                                                      *ctx.scale)
        return (None,) * 6 + tuple(reduced)


class HorovodAllgather(torch.autograd.Function):
    """allgather; the gradient is the Average-allreduce of the output's gradient, narrowed to
    this rank's rows."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.dim0, ctx.process_set = [_rows(tensor)], process_set
        return run("allgather", [tensor], name=name, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (mine,) = _allgather_gradient(ctx, [grad])
        return mine, None, None


class HorovodGroupedAllgather(torch.autograd.Function):
    """grouped_allgather; the gradients as `HorovodAllgather`'s, as one group."""

    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: ProcessSet, *tensors: torch.Tensor) -> tuple:
        ctx.dim0, ctx.process_set = [_rows(t) for t in tensors], process_set
        return tuple(run("allgather", tensors, grouped=True, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None, None, *_allgather_gradient(ctx, grads))


class HorovodBroadcast(torch.autograd.Function):
    """broadcast; the root's gradient is the average of every member's output gradient, the
    others' zero."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return run("broadcast", [tensor], root_rank=root_rank, name=name, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        mine = collective_rules.broadcast_gradient(TorchGradients(ctx.process_set, grouped=False),
                                                   grad.contiguous(), ctx.root_rank, basics.rank())
        return mine, None, None, None


class HorovodAlltoall(torch.autograd.Function):
    """alltoall: the received rows, plus (when `splits` is given) the int32 rows received from each
    member, not differentiable. The gradient travels back with the received splits."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Sequence[int] | torch.Tensor | None, name: str | None,
                process_set: ProcessSet) -> Any:
        output, received = run("alltoall", [tensor], splits=splits_list(splits), name=name, process_set=process_set)
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: torch.Tensor) -> tuple:
        mine = collective_rules.alltoall_gradient(TorchGradients(ctx.process_set), grad.contiguous(), ctx.received)
        return mine, None, None, None


class HorovodReducescatter(torch.autograd.Function):
    """reducescatter; the gradient is the allgather of the output's gradient (times the set size
    for Sum)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: int, process_set: ProcessSet,
                prescale_factor: float, postscale_factor: float) -> torch.Tensor:
        ctx.op, ctx.scale, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return run("reducescatter", [tensor], name=name, op=op, prescale_factor=prescale_factor,
                   postscale_factor=postscale_factor, process_set=process_set)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        (mine,) = _reducescatter_gradient(ctx, [grad])
        return mine, None, None, None, None, None


class HorovodGroupedReducescatter(torch.autograd.Function):
    """grouped_reducescatter; the gradients as `HorovodReducescatter`'s, as one group."""

    @staticmethod
    def forward(ctx: Any, name: str | None, op: int, process_set: ProcessSet, prescale_factor: float,
                postscale_factor: float, *tensors: torch.Tensor) -> tuple:
        ctx.op, ctx.scale, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return tuple(run("reducescatter", tensors, grouped=True, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:
        return (None,) * 5 + tuple(_reducescatter_gradient(ctx, grads))


def _contiguous(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.contiguous() for t in tensors]


def _rows(tensor: torch.Tensor) -> int:
    return tensor.shape[0] if tensor.dim() else 1


def _allgather_gradient(ctx: Any, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    me = members(ctx.process_set).index(basics.rank())
    return collective_rules.allgather_gradient(TorchGradients(ctx.process_set), _contiguous(grads), ctx.dim0, me)


def _reducescatter_gradient(ctx: Any, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return collective_rules.reducescatter_gradient(TorchGradients(ctx.process_set), _contiguous(grads), ctx.op,
                                                   *ctx.scale, len(members(ctx.process_set)))


def compressed(compression: type[Compressor], node: Callable[..., Any], tensors: Sequence[torch.Tensor]
                ) -> list[torch.Tensor]:
    """`node(*compressed tensors)` (a tuple of outputs), each output decompressed."""
    compressed = [compression.compress(t) for t in tensors]
    outputs = node(*(c for c, _ in compressed))
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(outputs, compressed)]


class TorchGradients:
    """`collective_rules.GradientCollectives` on torch tensors: the nodes above (unnamed,
    uncompressed) over `process_set`, so gradients have gradients too."""

    def __init__(self, process_set: ProcessSet, grouped: bool = True) -> None:
        self.process_set = process_set
        self.grouped = grouped

    def allreduce(self, tensors: Sequence[torch.Tensor], op: int, prescale: float,
                  postscale: float) -> list[torch.Tensor]:
        if not self.grouped:
            return [HorovodAllreduce.apply(t, None, None, op, prescale, postscale, self.process_set) for t in tensors]
        return list(HorovodGroupedAllreduce.apply(None, None, op, prescale, postscale, self.process_set, *tensors))

    def allgather(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return list(HorovodGroupedAllgather.apply(None, self.process_set, *tensors))

    def alltoall(self, tensor: torch.Tensor, splits: torch.Tensor) -> torch.Tensor:
        return HorovodAlltoall.apply(tensor, splits, None, self.process_set)[0]

    def average_and_gather_rows(self, tensors: Sequence[torch.Tensor],
                                inputs: Sequence[int]) -> tuple[list[torch.Tensor], torch.Tensor]:
        reduced = list(HorovodGroupedAllreduce.apply(None, None, Average, 1.0, 1.0, self.process_set, *tensors))
        rows = HorovodAllgather.apply(torch.tensor([list(inputs)], dtype=torch.int64), None, self.process_set)
        return reduced, rows

    def rows_before(self, rows: torch.Tensor, member: int) -> list[int]:
        return rows[:member].sum(dim=0).tolist()

    def narrow(self, tensor: torch.Tensor, starts: list[int], k: int, like: int) -> torch.Tensor:
        return tensor.narrow(0, int(starts[k]), int(like))

    def scale(self, tensor: torch.Tensor, factor: float) -> torch.Tensor:
        return tensor * factor

    def zeros_like(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(tensor)


def splits_list(splits: Sequence[int] | torch.Tensor | None) -> list[int] | None:
    """alltoall's `splits` (a list, an integer tensor or None) as a list of ints."""
    if isinstance(splits, torch.Tensor):
        if splits.is_floating_point():
            raise ValueError(f"alltoall: splits must hold integers, got a {splits.dtype} tensor")
        return [int(s) for s in splits.reshape(-1).tolist()]
    return None if splits is None else list(splits)
