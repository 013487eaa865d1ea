"""What ranks tell the coordinator (Request) and what it decides (Response).

Both are plain records (a named tuple and a dataclass) that travel as tuples of plain values
(see `wire.encode`), so a message can only ever decode into these fields.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import NamedTuple


class OpType(enum.IntEnum):
    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    JOIN = 3
    ADASUM = 4
    ALLTOALL = 5
    BARRIER = 6
    REDUCESCATTER = 7
    ERROR = 8
    ADD_PROCESS_SET = 9
    REMOVE_PROCESS_SET = 10


# Responses the cache may remember: they repeat every step of a training loop.
CACHEABLE = frozenset({OpType.ALLREDUCE, OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL,
                       OpType.REDUCESCATTER})
_ANONYMOUS = re.compile(r"[a-z_]+\.noname\.\d+")


def anonymous_name(prefix: str, number: int) -> str:
    """The name of the `number`-th op its process set ran without a name (ranks match such ops by
    order, as Horovod does)."""
    return f"{prefix}.noname.{number}"


def is_anonymous(name: str) -> bool:
    """A name `anonymous_name` made: it never comes back, so its response is not worth caching
    (every rank decides this from the name alone, so the caches stay alike)."""
    return _ANONYMOUS.fullmatch(name) is not None


class Request(NamedTuple):
    """One rank's submission of one tensor, as the coordinator sees it (a named tuple: one is
    built per tensor per step, three times faster than a frozen dataclass)."""

    rank: int
    op_type: int
    name: str
    dtype: str = ""
    shape: tuple[int, ...] = ()
    root_rank: int = -1
    reduce_op: int = 1
    prescale: float = 1.0
    postscale: float = 1.0
    splits: tuple[int, ...] = ()
    device: int = -1  # the CUDA device ordinal of the tensor's memory; -1: host memory

    def to_wire(self) -> tuple:
        return tuple(self)

    @classmethod
    def from_wire(cls, item: tuple) -> "Request":
        rank, op_type, name, dtype, shape, root, reduce_op, pre, post, splits, device = item
        return cls(int(rank), int(op_type), str(name), str(dtype), tuple(int(d) for d in shape), int(root),
                   int(reduce_op), float(pre), float(post), tuple(int(s) for s in splits), int(device))

    def signature(self) -> tuple:
        """Everything that must match across ranks and across steps for a cached response to apply."""
        return (self.op_type, self.dtype, self.shape, self.root_rank, self.reduce_op, self.prescale,
                self.postscale, self.splits, self.device)


@dataclass
class Response:
    """A decision every member executes in the same order.

    `shapes[i]` is tensor i's shape (for allgather: rank 0's shape; `first_dims[i]` lists every
    member's dim 0). `splits` is the alltoall matrix: splits[src][dst] rows. `on_device` (1) says
    that every member's tensors are in device memory, each on its own device: the response goes
    to the device transport.
    """

    op_type: int
    names: list[str]
    dtype: str = ""
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    first_dims: list[list[int]] = field(default_factory=list)
    splits: list[list[int]] = field(default_factory=list)
    root_rank: int = -1
    reduce_op: int = 1
    prescale: float = 1.0
    postscale: float = 1.0
    error: str = ""
    last_joined_rank: int = -1
    process_set_ranks: tuple[int, ...] = ()
    on_device: int = 0

    def to_wire(self) -> tuple:
        return (self.op_type, self.names, self.dtype, self.shapes, self.first_dims, self.splits, self.root_rank,
                self.reduce_op, self.prescale, self.postscale, self.error, self.last_joined_rank,
                self.process_set_ranks, self.on_device)

    @classmethod
    def from_wire(cls, item: tuple) -> "Response":
        (op_type, names, dtype, shapes, first_dims, splits, root, reduce_op, pre, post, error, last,
         ps_ranks, on_device) = item
        return cls(int(op_type), [str(n) for n in names], str(dtype), [tuple(s) for s in shapes],
                   [list(d) for d in first_dims], [list(s) for s in splits], int(root), int(reduce_op),
                   float(pre), float(post), str(error), int(last), tuple(ps_ranks), int(on_device))

    def split(self) -> list["Response"]:
        """One single-tensor response per fused tensor (the form the cache stores)."""
        if len(self.names) == 1:
            return [self]
        return [Response(self.op_type, [name], self.dtype, [self.shapes[i]],
                         [self.first_dims[i]] if self.first_dims else [], self.splits, self.root_rank,
                         self.reduce_op, self.prescale, self.postscale, on_device=self.on_device)
                for i, name in enumerate(self.names)]

    def tensor_bytes(self, itemsize: int) -> int:
        total = 0
        for shape in self.shapes:
            count = 1
            for dim in shape:
                count *= dim
            total += count * itemsize
        return total
