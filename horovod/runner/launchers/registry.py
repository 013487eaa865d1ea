"""Launchers by name: a table of lazy factories, so naming a launcher imports only that launcher.

Launchers never import this module; adding one (mpirun, Spark, Ray) is one line in `_FACTORIES`.
"""

from __future__ import annotations

from horovod.common.lazy import load
from horovod.runner import network
from horovod.runner.launchers.base import LaunchContext, Launcher

# name -> "module:class"; the class is built as Cls(context).
_FACTORIES: dict[str, str] = {
    "local": "horovod.runner.launchers.local:LocalLauncher",
    "ssh": "horovod.runner.launchers.ssh:SshLauncher",
    "ray": "horovod.ray.launcher:RayLauncher",  # a Ray actor on the node named by the slot's host
    "spark": "horovod.spark.launcher:SparkLauncher",
    "spark_elastic": "horovod.spark.launcher:ElasticSparkLauncher",  # a host is one Spark task
}


def names() -> list[str]:
    """The launchers that can be asked for by name."""
    return sorted(_FACTORIES)


def default_name(hostname: str) -> str:
    """The launcher for a host of `-H`/`--hostfile`: child processes here, ssh elsewhere."""
    return "local" if network.is_local_host(hostname) else "ssh"


def create(name: str, context: LaunchContext) -> Launcher:
    """Build the launcher called `name` for one job."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown launcher {name!r}; choose one of: {', '.join(names())}")
    launcher: Launcher = load(_FACTORIES[name])(context)
    return launcher
