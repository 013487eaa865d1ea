"""Elastic training for PyTorch: `hvd.elastic.run`, `TorchState`, `ElasticSampler`, `ObjectState`.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for batch in loader:
                ...
                state.commit()

    train(hvd.elastic.TorchState(model, optimizer, epoch=0))

See docs/elastic.md; the loop itself is `horovod.common.elastic`.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from horovod.common import basics
from horovod.common.elastic import ObjectState as _ObjectStateBase
from horovod.common.elastic import State, run_fn
from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.elastic.state import TorchState
from horovod.torch.functions import broadcast_object
from horovod.torch.mpi_ops import init

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]


def _reset() -> None:
    basics.shutdown()
    init()  # PyTorch's own: it also forgets the handles of the round that is over


def run(func: F) -> F:
    """Decorator: run `func(state, ...)` so that it survives failures and host changes."""
    return run_fn(func, _reset)


class ObjectState(_ObjectStateBase):
    """Plain Python attributes kept across resets: `hvd.elastic.ObjectState(epoch=0, batch=0)`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(broadcast_object, basics.rank, **kwargs)
