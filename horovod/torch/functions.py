"""Helpers that start every rank from the same point: parameters, optimizer state, objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch

from horovod.common import basics, ops
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.torch._bridge import Pending, start
from horovod.torch.sharded import ShardedOptimizer

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]


def _named_tensors(params: Any) -> list[tuple[str | None, torch.Tensor]]:
    if isinstance(params, Mapping):  # a state_dict: key order may differ between ranks, so sort
        return sorted(params.items(), key=lambda item: item[0])
    if isinstance(params, torch.Tensor) or not isinstance(params, Iterable):
        raise ValueError(f"invalid params of type: {type(params)}. broadcast_parameters expects a state_dict, "
                         "named_parameters() or a list of tensors")
    return [p if isinstance(p, tuple) else (None, p) for p in params]


def _broadcast_in_place(tensors: list[tuple[str | None, torch.Tensor]], root_rank: int,
                        process_set: ProcessSet) -> None:
    """Overwrite every tensor with the root's: all broadcasts in flight at once, then wait."""
    pending: list[tuple[Pending, torch.Tensor, torch.Tensor]] = []
    for name, tensor in tensors:
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"broadcast_parameters: {name or 'an entry'} is a {type(tensor).__name__}, not a "
                             "tensor; broadcast other values with broadcast_object")
        with torch.no_grad():
            staged = tensor if tensor.is_contiguous() else tensor.contiguous()
            pending.append((start("broadcast", [staged], inplace=True, root_rank=root_rank, name=name,
                                   process_set=process_set), staged, tensor))
    for handle, staged, tensor in pending:
        handle.wait()
        if staged is not tensor:
            with torch.no_grad():
                tensor.copy_(staged)


def broadcast_parameters(params: Any, root_rank: int, process_set: ProcessSet = global_process_set) -> None:
    """Overwrite parameters on every rank with `root_rank`'s, in place.

    `params`: `model.state_dict()` (buffers included), `model.named_parameters()`, or a list of
    tensors (named ops need the same order on every rank)."""
    _broadcast_in_place(_named_tensors(params), root_rank, process_set)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Make every rank's optimizer state and hyper-parameters equal to `root_rank`'s.

    Unlike Horovod's, this never runs an optimizer step: the root's state_dict is sent as is
    (its tensors by broadcast, the rest as one pickled object) and the other ranks adopt it with
    `load_state_dict`. The root's optimizer is not touched, so its numbers stay exactly as they
    were. An empty state (no step taken yet) stays empty everywhere; torch creates it on the
    first step identically on every rank. `model` is accepted for compatibility and unused.
    """
    if isinstance(optimizer, ShardedOptimizer):  # its state blocks belong to their ranks
        optimizer.broadcast_hyperparameters(root_rank)
        return
    is_root = basics.rank() == root_rank
    tensors: list[torch.Tensor] = []
    skeleton = _without_tensors(optimizer.state_dict(), tensors) if is_root else None
    specs = [(tuple(t.shape), t.dtype) for t in tensors]
    skeleton, specs = ops.broadcast_object((skeleton, specs), root_rank, "optimizer_state", process_set)
    if not is_root:
        tensors = [torch.empty(shape, dtype=dtype) for shape, dtype in specs]
    _broadcast_in_place([(f"optimizer_state.{i}", t) for i, t in enumerate(tensors)], root_rank, process_set)
    if not is_root:
        optimizer.load_state_dict(_with_tensors(skeleton, tensors))


@dataclass(frozen=True)
class _TensorSlot:
    """Where a tensor sat in a state_dict that travels without its tensors."""

    index: int


def _without_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return _TensorSlot(len(tensors) - 1)
    if isinstance(value, dict):
        return {k: _without_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_without_tensors(v, tensors) for v in value)
    return value


def _with_tensors(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, _TensorSlot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _with_tensors(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_with_tensors(v, tensors) for v in value)
    return value


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """`root_rank`'s object (anything cloudpickle can serialise), returned on every rank."""
    return ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's object, as a list indexed by rank within the set."""
    return ops.allgather_object(obj, name, process_set)
