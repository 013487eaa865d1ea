"""`horovod.run`: run a Python function on every rank of a job and collect what each returns.

It is `horovodrun` driven from Python: the same flags (as keyword arguments), the same slot
assignment, launcher and failure policy. The function travels to the workers through the job's
rendezvous store (scope `runfunc`), and each rank sends its return value back the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import site
import sys
import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

import cloudpickle

if TYPE_CHECKING:
    from horovod.runner.job import Job, JobSpec

__all__ = ["run", "run_function", "run_spec"]


def deprecated_alias(old: str, new: str, old_value: Any, new_value: Any) -> Any:
    """Resolve a deprecated keyword alias: warn, and refuse both spellings at once."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ValueError(f"give either {new}= or the deprecated {old}=, not both")
    warnings.warn(f"{old}= is deprecated, use {new}= instead", DeprecationWarning, stacklevel=3)
    return old_value


def _pythonpath_with_horovod(current: str | None) -> str | None:
    """Make the workers import the same `horovod` as this process, even if it is not installed.

    Site-packages directories are left alone: putting them on PYTHONPATH would move them ahead
    of the standard library.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    site_dirs = {os.path.abspath(d) for d in site.getsitepackages() + [site.getusersitepackages()]}
    parts = [p for p in (current or "").split(os.pathsep) if p]
    if root in site_dirs or root in parts:
        return current
    return os.pathsep.join([root, *parts])


def run(
    func: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_proc: int | None = None,
    min_num_proc: int | None = None,
    max_num_proc: int | None = None,
    slots: int | None = None,
    reset_limit: int | None = None,
    cooldown_range: tuple[int, int] | None = None,
    hosts: str | None = None,
    hostfile: str | None = None,
    host_discovery_script: str | None = None,
    start_timeout: int | None = None,
    ssh_port: int | None = None,
    ssh_identity_file: str | None = None,
    disable_cache: bool | None = None,
    output_filename: str | None = None,
    verbose: bool | None = None,
    use_gloo: bool | None = None,
    use_mpi: bool | None = None,
    mpi_args: str | None = None,
    network_interface: str | None = None,
    network_interfaces: Sequence[str] | str | None = None,
    executable: str | None = None,
    np: int | None = None,
    min_np: int | None = None,
    max_np: int | None = None,
) -> list[Any]:
    """Run `func(*args, **kwargs)` on `num_proc` ranks; return the results in rank order.

    `num_proc` defaults to every slot of `hosts`/`hostfile`, or 1 on this machine alone. If a
    rank fails, the others are stopped and RuntimeError names the first failing rank, its exit
    code and its exception. With `min_num_proc`, `max_num_proc` or `host_discovery_script` the job
    is elastic (see docs/elastic.md) and the results are those of the final round's first
    `min_num_proc` ranks.
    """
    # Imported here so that `python -m horovod.runner.launch` does not find launch half-imported.
    from horovod.runner import launch, noop_flags

    num_proc = deprecated_alias("np", "num_proc", np, num_proc)
    min_num_proc = deprecated_alias("min_np", "min_num_proc", min_np, min_num_proc)
    max_num_proc = deprecated_alias("max_np", "max_num_proc", max_np, max_num_proc)
    if network_interface is not None:
        network_interfaces = deprecated_alias("network_interface", "network_interfaces",
                                         network_interface, network_interfaces)
    if hosts is not None and hostfile is not None:
        raise ValueError("hosts and hostfile are mutually exclusive: give one of them")

    hargs = launch.default_args()
    hargs.hosts, hargs.hostfile = hosts, hostfile
    hargs.num_proc = num_proc if num_proc is not None else (min_num_proc or 1)
    if num_proc is None and (hosts or hostfile):
        hargs.num_proc = sum(host.slots for host in launch.host_list(hargs))
    hargs.start_timeout = start_timeout
    hargs.min_num_proc, hargs.max_num_proc, hargs.slots = min_num_proc, max_num_proc, slots
    hargs.reset_limit, hargs.host_discovery_script = reset_limit, host_discovery_script
    hargs.cooldown_range = list(cooldown_range) if cooldown_range is not None else None
    hargs.ssh_port, hargs.ssh_identity_file = ssh_port, ssh_identity_file
    hargs.disable_cache = bool(disable_cache)
    hargs.output_filename, hargs.verbose = output_filename, bool(verbose)
    hargs.use_gloo, hargs.use_mpi, hargs.mpi_args = use_gloo, use_mpi, mpi_args
    if isinstance(network_interfaces, str):
        network_interfaces = network_interfaces.split(",")
    hargs.nics = [nic.strip() for nic in network_interfaces or () if nic.strip()] or None
    launch.validate(hargs)
    noop_flags.warn_noop_flags(hargs)  # disable_cache=True says, as --disable-cache does, that it changes nothing

    return run_spec(hargs, function_job_spec(hargs, executable), func, args, kwargs)


def function_job_spec(hargs: argparse.Namespace, executable: str | None = None) -> JobSpec:
    """The job that runs a function on every slot of `hargs` (validated): `horovod.runner.run_task`
    on each, importing the same `horovod` as this process."""
    from horovod.runner import launch

    command = [executable or sys.executable, "-m", "horovod.runner.run_task"]
    spec = launch.plan_job(hargs, command)
    pythonpath = _pythonpath_with_horovod(os.environ.get("PYTHONPATH"))
    if pythonpath:
        spec = dataclasses.replace(spec, extra_env={**spec.extra_env, "PYTHONPATH": pythonpath})
    return spec


def run_spec(hargs: argparse.Namespace, spec: JobSpec, func: Callable[..., Any],
             args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> list[Any]:
    """Start the job `spec` and run `func(*args, **kwargs)` on every rank; the results in rank order.

    Shared by `horovod.run` and `horovod.spark.run` (which starts the same job in Spark tasks)."""
    from horovod.runner import launch

    with launch.make_job(hargs, spec) as job:
        return run_function(job, func, args, kwargs)


def run_function(job: "Job", func: Callable[..., Any], args: Sequence[Any] = (),
                 kwargs: dict[str, Any] | None = None) -> list[Any]:
    """Run `func` on the workers of a started `job` (they run `horovod.runner.run_task`); the
    results of `job.result_ranks()`, or RuntimeError naming the failure. Also used by
    `horovod.ray.ElasticRayExecutor`, whose workers are Ray actors."""
    from horovod.runner.report import format_result

    assert job.store is not None, "start the job (with ...) first"
    job.store.put("runfunc", "func", cloudpickle.dumps((func, tuple(args), dict(kwargs or {}))))
    result = job.run()
    if not result.ok:
        raise RuntimeError(format_result(result))
    results = []
    for rank in job.result_ranks():
        raw = job.store.get("runfunc_result", str(rank))
        if raw is None:
            raise RuntimeError(f"rank {rank} exited with status 0 but sent no result")
        results.append(cloudpickle.loads(raw))
    return results
