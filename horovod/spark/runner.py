"""`horovod.spark.run`: run a function as a Horovod job whose ranks live in Spark tasks.

The flow: the driver serves a control store (`horovod.spark.control`) and submits one barrier
stage of `num_proc` tasks (`horovod.spark.stage`); barrier mode schedules them all together or
none. Each task registers its host; the driver gives the ranks to the hosts in the order the
tasks came (local ranks by task index within a host) and runs the very job `horovod.run` runs
(`horovod.runner.run_spec`): same rendezvous store, same worker (`horovod.runner.run_task`),
same failure policy and report, with the `spark` launcher starting each worker in its task. With
`use_mpi=True` the job is `horovod.run(use_mpi=True)`'s instead, mpirun starting its daemons in
the tasks through `horovod.spark.mpirun_rsh`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shlex
import socket
import sys
from typing import IO, Any, Callable, Iterator, Sequence

import cloudpickle

from horovod.common import wire
from horovod.common.rendezvous import RendezvousServer
from horovod.common.settings import SPARK_CONTROL_SECRET_ENV, Settings
from horovod.runner import function_job_spec, launch, run_spec
from horovod.runner.job import JobSpec
from horovod.runner.launchers import OutputOptions
from horovod.spark import control, mpirun_rsh
from horovod.spark.control import ControlAddress
from horovod.spark.stage import BarrierStage



def active_spark_context() -> Any:
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError("horovod.spark.run needs an active Spark session: create one first "
                           "(SparkSession.builder...getOrCreate())")
    return sc


def placement(hosts: dict[int, str]) -> dict[str, list[int]]:
    """Task indices per host, hosts in the order of their first task: local rank i of a host is
    its i-th task."""
    by_host: dict[str, list[int]] = {}
    for index in sorted(hosts):
        by_host.setdefault(hosts[index], []).append(index)
    return by_host


@contextlib.contextmanager
def redirected(stdout: IO[str] | None, stderr: IO[str] | None) -> Iterator[None]:
    """Show the workers' output on the given streams for the duration of the run."""
    with contextlib.ExitStack() as stack:
        if stdout is not None:
            stack.enter_context(contextlib.redirect_stdout(stdout))
        if stderr is not None:
            stack.enter_context(contextlib.redirect_stderr(stderr))
        yield


@contextlib.contextmanager
def control_store(sc: Any) -> Iterator[tuple[RendezvousServer, ControlAddress]]:
    """The store the driver serves for its tasks (`horovod.spark.control`), for one run."""
    driver_host = socket.gethostbyname(sc.getConf().get("spark.driver.host", "127.0.0.1"))
    secret = wire.new_secret_key()
    store = RendezvousServer(secret, driver_host)
    address = ControlAddress(driver_host, store.start(), secret.hex())
    try:
        yield store, address
    finally:
        store.stop()


def job_spec(hosts: str, num_proc: int, start_timeout: float, verbose: int, nics: Sequence[str] | None,
             prefix_output_with_timestamp: bool, executable: str | None, env: dict[str, str] | None,
             launcher: str, options: dict[str, str]) -> tuple[argparse.Namespace, JobSpec]:
    """The flags and the job of `horovod.run` for a function whose workers live in Spark tasks."""
    hargs = launch.default_args()
    hargs.num_proc, hargs.start_timeout, hargs.verbose = num_proc, start_timeout, verbose >= 2
    hargs.hosts = hosts
    hargs.prefix_output_with_timestamp = prefix_output_with_timestamp
    hargs.nics = list(nics) if nics else None
    launch.validate(hargs)
    spec = function_job_spec(hargs, executable)
    spec = dataclasses.replace(
        spec, launcher=launcher, extra_env={**spec.extra_env, **(env or {})}, launcher_options=options,
        output=OutputOptions(prefix_timestamp=prefix_output_with_timestamp))
    return hargs, spec


def release_idle_tasks(store: RendezvousServer, by_host: dict[str, list[int]]) -> None:
    """Under mpirun, a host's ranks all run under its daemon, in the host's first task: the other
    tasks there run nothing (they only held their slots until the stage started)."""
    for tasks in by_host.values():
        for index in tasks[1:]:
            store.put(control.START, str(index), cloudpickle.dumps((["true"], {})))


def default_start_timeout(start_timeout: float | None) -> float:
    """`start_timeout`, else `HOROVOD_SPARK_START_TIMEOUT`, else Horovod's 600 s."""
    if start_timeout is not None:
        return start_timeout
    return Settings.from_env().spark_start_timeout


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    use_mpi: bool | None = None,
    use_gloo: bool | None = None,
    extra_mpi_args: str | None = None,
    env: dict[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    verbose: int = 1,
    nics: Sequence[str] | None = None,
    prefix_output_with_timestamp: bool = False,
    executable: str | None = None,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `num_proc` Spark tasks as one Horovod job; results by rank.

    `num_proc` defaults to the Spark context's default parallelism. `hvd.init()` works inside
    `fn`. A failing rank fails the call with RuntimeError naming its rank, host and traceback.
    `env` adds variables to the workers' environment (on top of the driver's); `stdout`/`stderr`
    receive the workers' `[rank]<stdout>:` lines (default: this process's). `verbose >= 2` tells
    how the ranks were placed. `start_timeout` (default `HOROVOD_SPARK_START_TIMEOUT`, else 600 s)
    bounds how long the tasks may take to start together: too few free task slots is an error.
    `use_mpi=True` starts the ranks with mpirun, whose daemons run in the tasks (`mpirun_rsh`);
    `extra_mpi_args` goes on mpirun's command line.
    """
    if use_mpi and use_gloo:
        raise ValueError("use_mpi and use_gloo are mutually exclusive: pick one controller")
    if extra_mpi_args and not use_mpi:
        raise ValueError("extra_mpi_args only applies with use_mpi=True")
    sc = active_spark_context()
    num_proc = sc.defaultParallelism if num_proc is None else num_proc
    if num_proc < 1:
        raise ValueError(f"num_proc must be at least 1, got {num_proc}")
    start_timeout = default_start_timeout(start_timeout)
    with control_store(sc) as (store, address), \
            BarrierStage(sc, num_proc, store, address, start_timeout) as stage, redirected(stdout, stderr):
        by_host = placement(stage.wait_registered())
        if use_mpi:
            hosts = ",".join(f"{mpirun_rsh.host_name(tasks[0])}:{len(tasks)}" for tasks in by_host.values())
            env = {**(env or {}), SPARK_CONTROL_SECRET_ENV: address.secret_hex}
        else:
            hosts = ",".join(f"{host}:{len(tasks)}" for host, tasks in by_host.items())
        hargs, spec = job_spec(
            hosts, num_proc, start_timeout, verbose, nics, prefix_output_with_timestamp, executable, env, "spark",
            {**address.as_options(), "placement": json.dumps(by_host)})
        if use_mpi:
            release_idle_tasks(store, by_host)
            hargs.use_mpi = True
            hargs.mpi_args = " ".join([*([extra_mpi_args] if extra_mpi_args else []), "--mca plm_rsh_agent",
                                       shlex.quote(shlex.join(mpirun_rsh.agent_command(address)))])
        if verbose >= 2:
            print(f"horovod.spark.run: {num_proc} ranks on {by_host}", file=sys.stderr, flush=True)
        return run_spec(hargs, spec, fn, args, kwargs)
