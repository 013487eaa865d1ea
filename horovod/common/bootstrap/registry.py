"""Bootstraps by name (`HOROVOD_BOOTSTRAP`, `Settings.bootstrap`), imported only when chosen.

The table holds `module:class` strings, so a bootstrap module never imports this registry and
adding one (MPI) is one line here.
"""

from __future__ import annotations

from typing import Any

from horovod.common.lazy import load
from horovod.common.bootstrap.base import Bootstrap, Membership
from horovod.common.settings import Settings

_FACTORIES: dict[str, str] = {
    "env": "horovod.common.bootstrap.env:EnvBootstrap",
    "store": "horovod.common.bootstrap.store:StoreBootstrap",
    "mpi": "horovod.common.bootstrap.mpi:MpiBootstrap",
}


def create(name: str) -> Bootstrap:
    """The bootstrap called `name`; ValueError listing the choices when there is none."""
    if name not in _FACTORIES:
        raise ValueError(f"HOROVOD_BOOTSTRAP={name!r} is not a bootstrap; "
                         f"choose one of: {', '.join(sorted(_FACTORIES))}")
    return load(_FACTORIES[name])()


def join(settings: Settings, previous_round: int, comm: Any = None) -> Membership:
    """This process's membership in the current round, from the bootstrap `settings` name."""
    return create(settings.bootstrap).join(settings, previous_round, comm)
