"""Transports, chosen by name (`HOROVOD_CPU_OPERATIONS`): each moves bytes between ranks."""

from __future__ import annotations

from typing import Callable

from horovod.common.transport.base import PeerFailure, Transport

_REGISTRY: dict[str, Callable[..., Transport]] = {}


def register(name: str, factory: Callable[..., Transport]) -> None:
    _REGISTRY[name] = factory


def create(name: str, **kwargs: object) -> Transport:
    """Build the transport called `name`; 'gloo' is accepted as Horovod's name for our TCP one."""
    from horovod.common.transport import tcp  # noqa: F401  (registers itself)

    key = "tcp" if name in ("gloo", "") else name
    if key not in _REGISTRY:
        raise ValueError(
            f"HOROVOD_CPU_OPERATIONS={name!r} is not an available transport; "
            f"choose one of: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[key](**kwargs)


__all__ = ["PeerFailure", "Transport", "create", "register"]
