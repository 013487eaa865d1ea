"""`TorchState`: a model, an optimizer, samplers and plain attributes, kept across resets.

Each kind of value has a handler that knows how to snapshot it (`save`), go back to the snapshot
(`restore`), take rank 0's (`sync`) and adjust to a new membership (`reset`); anything else is
kept like `ObjectState` keeps it. Assigning a handled attribute (`state.model = other`) hands the
new object to its handler. The table of handlers is replaceable (`set_handler_registry`).
"""

from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import torch

from horovod.common import basics
from horovod.common.elastic import ObjectState
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from horovod.torch.mpi_ops import alltoall
from horovod.torch.shard_layout import Piece
from horovod.torch.sharded import ShardedOptimizer


class StateHandler:
    """Saves, restores and syncs one value of a `TorchState`."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        """Take rank 0's value on every rank."""
        raise NotImplementedError(f"{type(self).__name__} must define sync(): how every rank takes rank 0's value")

    def reset(self) -> None:
        """Nothing to adjust by default."""


class ModelStateHandler(StateHandler):
    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(StateHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(StateHandler):
    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))

    def reset(self) -> None:
        self.value.reset()


class ShardedOptimizerStateHandler(StateHandler):
    """A `ShardedDistributedOptimizer`: each rank's block of the state, kept across membership
    changes without a checkpoint.

    A commit (`save`) keeps a copy of this rank's block and sends one to the previous rank, so
    every block lives on two ranks. After ranks leave or join, `sync` (or, when only ranks left
    and nothing is synced, the optimizer's next collective) cuts the parameters for the new
    membership and every rank rebuilds its new block from the copies the members hold. State is
    lost only when a rank and the next one both leave between two commits (a clear error says so).
    """

    def __init__(self, value: ShardedOptimizer) -> None:
        self._exchange = False  # the first snapshot is local: a joining rank makes it alone
        super().__init__(value)
        self._exchange = True

    def save(self) -> None:
        self.value.ensure_layout()
        self._own = self.value.state_pieces()
        self._copy = _neighbour_copy(self._own) if self._exchange else []

    def restore(self) -> None:
        self.value.reshard_on_next_step(self._own + self._copy)

    def sync(self) -> None:
        self.value.reshard(self._own + self._copy)
        self.save()

    def reset(self) -> None:
        self.value.reshard_on_next_step(self._own + self._copy)


def _neighbour_copy(pieces: list[Piece]) -> list[Piece]:
    """Send `pieces` to the previous member and return the next member's (alltoall of bytes)."""
    size, rank = basics.size(), basics.rank()
    if size == 1:
        return []
    payload = torch.frombuffer(bytearray(pickle.dumps(pieces)), dtype=torch.uint8)
    splits = [0] * size
    splits[(rank - 1) % size] = len(payload)
    received, _ = alltoall(payload, splits, name="sharded_state.copy")
    return pickle.loads(received.numpy().tobytes())


_registry: list[tuple[type, Callable[[Any], StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (ShardedOptimizer, ShardedOptimizerStateHandler),  # before Optimizer: it reports the wrapped class
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, Callable[[Any], StateHandler]]]:
    return _registry


def set_handler_registry(registry: list[tuple[type, Callable[[Any], StateHandler]]]) -> None:
    global _registry
    _registry = registry


def _handler_for(value: Any) -> StateHandler | None:
    for kind, handler in _registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """`TorchState(model, optimizer, epoch=0, batch=0)`; attributes read as given."""

    def __init__(self, model: torch.nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                 **kwargs: Any) -> None:
        values = dict(kwargs)
        if model is not None:
            values["model"] = model
        if optimizer is not None:
            values["optimizer"] = optimizer
        handlers = {name: _handler_for(value) for name, value in values.items()}
        self._handlers = {name: handler for name, handler in handlers.items() if handler is not None}
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)
        plain = {name: value for name, value in values.items() if name not in self._handlers}
        super().__init__(broadcast_object, basics.rank, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handler = self.__dict__.get("_handlers", {}).get(name)
        if handler is not None:
            handler.value = value
            handler.save()
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()
