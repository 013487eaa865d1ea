"""Bootstraps by name (`HOROVOD_BOOTSTRAP`, `Settings.bootstrap`), imported only when chosen.

The table holds `module:class` strings, so a bootstrap module never imports this registry and
adding one (MPI) is one line here.
"""

from __future__ import annotations

from typing import Any

from horovod.common.launcher_env import check_not_alone
from horovod.common.lazy import load
from horovod.common.bootstrap.base import Bootstrap, Membership
from horovod.common.settings import Settings

_FACTORIES: dict[str, str] = {
    "env": "horovod.common.bootstrap.env:EnvBootstrap",
    "store": "horovod.common.bootstrap.store:StoreBootstrap",
    "mpi": "horovod.common.bootstrap.mpi:MpiBootstrap",
    "torchrun": "horovod.common.bootstrap.torchrun:TorchrunBootstrap",
}


def create(name: str) -> Bootstrap:
    """The bootstrap called `name`; ValueError listing the choices when there is none."""
    if name not in _FACTORIES:
        raise ValueError(f"HOROVOD_BOOTSTRAP={name!r} is not a bootstrap; "
                         f"choose one of: {', '.join(sorted(_FACTORIES))}")
    return load(_FACTORIES[name])()


def join(settings: Settings, previous_round: int, comm: Any = None) -> Membership:
    """This process's membership in the current round, from the bootstrap `settings` name; ValueError
    when it finds the process alone while a launcher's variables say the job has several."""
    membership = create(settings.bootstrap).join(settings, previous_round, comm)
    try:
        check_not_alone(settings.bootstrap, membership.topology.size, settings.launcher_sizes)
    except ValueError:
        membership.close()
        raise
    return membership
