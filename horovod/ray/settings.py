"""What `create_settings(...)` returns, and the driver's place in the Ray cluster."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import ray

from horovod.runner.env_builder import horovod_env


@dataclass
class RaySettings:
    """`RayExecutor.create_settings(...)`: how long to wait, and which network interfaces to use.
    Scripts may change a field after it is made (`settings.timeout_s = 60`), as Horovod's allow."""

    timeout_s: float = 30  # HOROVOD_START_TIMEOUT of the workers: every rank must init() within it
    ssh_identity_file: str | None = None  # accepted for Horovod's signature; Ray needs no ssh
    ssh_str: str | None = None
    placement_group_timeout_s: float = 100  # how long the cluster may take to place every worker
    nics: tuple[str, ...] | None = None  # HOROVOD_GLOO_IFACE, as --network-interfaces

    def worker_env(self) -> dict[str, str]:
        """The `HOROVOD_*` variables these settings give every worker (as horovodrun's flags would)."""
        return horovod_env(SimpleNamespace(start_timeout=self.timeout_s, nics=list(self.nics or ())))


def warn_ignored(option: str, why: str) -> None:
    """An option of Horovod's signature that has no effect on Ray says so, instead of being dropped quietly."""
    warnings.warn(f"horovod.ray: {option} has no effect here: {why}", UserWarning, stacklevel=3)


NO_SSH = "Ray starts the workers as actors; nothing is copied or started over ssh"


def ray_address() -> str:
    """The address this driver's node has in the cluster: where the workers reach the store."""
    if not ray.is_initialized():
        ray.init()
    return ray.util.get_node_ip_address()


@dataclass
class ElasticRaySettings(RaySettings):
    """`ElasticRayExecutor.create_settings(...)`: the elastic limits, besides `RaySettings`.
    `discovery` finds the hosts: the executor sets it to a `RayHostDiscovery` unless it is made
    with `override_discovery=False`, when a script's own (`settings.discovery = ...`) is used."""

    min_num_proc: int = 1
    max_num_proc: int | None = None
    reset_limit: int | None = None
    elastic_timeout: float = 600
    cooldown_range: tuple[int, int] | None = None
    verbose: bool = False
    discovery: Any = None
