"""`TorchState`: a model, an optimizer, samplers and plain attributes, kept across resets.

Each kind of value has a handler that knows how to snapshot it (`save`), go back to the snapshot
(`restore`), take rank 0's (`sync`) and adjust to a new membership (`reset`); anything else is
kept like `ObjectState` keeps it. Assigning a handled attribute (`state.model = other`) hands the
new object to its handler. The table of handlers is replaceable (`set_handler_registry`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from horovod.common import basics
from horovod.common.elastic import ObjectState
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters


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


_registry: list[tuple[type, Callable[[Any], StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
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
