"""The executor side of `horovod.spark.run`: one barrier task hosts one Horovod worker process
(and of `run_elastic`: one task hosts workers one after another, saying it is alive meanwhile).

The task says where it runs, waits for the driver to send the worker's command and environment,
starts it as a child in its own session (so a signal reaches everything it started), streams its
output lines to the driver, passes on the driver's signals, and reports the exit code. The worker
never outlives the task: it is killed if the task's Python process dies (parent-death signal) and
its whole process group is killed when the task returns or is interrupted by Spark. Nor does it
outlive the driver: when the task's connection to the driver's store fails (the driver was killed
or crashed, or its host cannot be reached), the task says so on its stderr (the executor's log)
and stops the worker's group as the orphan guard would (`orphans.stop_groups`). The worker
learns the GPU addresses Spark gave its task from the task (`get_available_devices`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from typing import IO, Any, Callable, Iterable, Iterator

import cloudpickle

from horovod.common import wire
from horovod.common.rendezvous import RendezvousClient
from horovod.runner.launchers.orphans import parent_death_signal, stop_groups
from horovod.common.settings import SPARK_TASK_GPUS_ENV, Settings
from horovod.spark import control
from horovod.spark.control import ControlAddress

_SIGNAL_POLL_SECONDS = 0.2
# In the worker, before exec: the kernel kills it when the task's thread goes (not Linux: the
# task's cleanup below still stops the worker when it can).
_die_with_parent = parent_death_signal(signal.SIGKILL)


def get_available_devices() -> list[str]:
    """In a worker of `horovod.spark.run`/`run_elastic`: the GPU addresses Spark's resource
    scheduling gave the task hosting it (`spark.task.resource.gpu.amount`); empty without any.

    The worker is a process of its own and cannot see the task's `TaskContext`, so the task hands
    the addresses down in the worker's environment."""
    return list(Settings.from_env().spark_task_gpus)


def task_gpus(context: Any) -> tuple[str, ...]:
    """The GPU addresses Spark gave the task of `context` (a `TaskContext`)."""
    gpu = context.resources().get("gpu")
    return tuple(gpu.addresses) if gpu is not None else ()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _OutputSender:
    """Sends the worker's stdout and stderr lines to the driver, numbered in the order read."""

    def __init__(self, client: RendezvousClient, key: str) -> None:
        self._client, self._key = client, key
        self._lock = threading.Lock()
        self._count = 0

    def pump(self, pipe: IO[bytes], name: str) -> None:
        try:
            for raw in iter(pipe.readline, b""):
                with self._lock:
                    self._client.put(control.OUTPUT, f"{self._key}.{self._count}", wire.encode((name, raw)))
                    self._count += 1
        except OSError:
            pass  # the driver is gone: `run_worker` says so and stops the worker
        finally:
            pipe.close()

    def close(self) -> None:
        self._client.put(control.OUTPUT, f"{self._key}.end", str(self._count).encode())


def _driver_lost(client: RendezvousClient, key: str, env: dict[str, str], group: int,
                 exc: OSError) -> ConnectionError:
    """The task's control connection failed: the driver is gone (killed, crashed) or cannot be
    reached. Stop the worker's group, saying why on the task's stderr (the executor's log), and
    return the error that fails the task."""
    host, port = client.address
    rank = f"rank {env['HOROVOD_RANK']}, " if env.get("HOROVOD_RANK") else ""
    reason = (f"horovod.spark: task {key} lost its connection to the Spark driver's control store at {host}:{port} "
              f"({type(exc).__name__}: {exc}): the driver exited (killed, or it crashed) or cannot be reached; "
              "stopping the worker so that it does not outlive the driver")
    stop_groups(reason, {group: f"{rank}process group {group}"})
    return ConnectionError(reason)


def run_worker(client: RendezvousClient, key: str, argv: list[str], env: dict[str, str],
               gpus: tuple[str, ...]) -> int:
    """Run one worker to its end, telling it the task's `gpus`: stream its output and pass on the
    driver's signals under `key`, then report its exit code (`control.EXIT`) and return it."""
    env = {**env, SPARK_TASK_GPUS_ENV: ",".join(gpus)}
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        sender = _OutputSender(client, key)
        pumps = [threading.Thread(target=sender.pump, args=(pipe, name), daemon=True)
                 for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))]
        for pump in pumps:
            pump.start()
        signals = 0
        while proc.poll() is None:
            try:
                signum = int(client.get(control.SIGNAL, f"{key}.{signals}", _SIGNAL_POLL_SECONDS))
            except OSError as exc:
                if isinstance(exc, TimeoutError) and exc.errno is None:  # no signal yet (a dead link has an errno)
                    continue
                raise _driver_lost(client, key, env, proc.pid, exc) from exc
            signals += 1
            try:
                os.killpg(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        for pump in pumps:
            pump.join()
        sender.close()
    finally:
        _kill_group(proc)  # whatever the worker left running in its group, or all of it if we were interrupted
        proc.wait()
    client.put(control.EXIT, key, str(proc.returncode).encode())
    return proc.returncode


def connect(address: ControlAddress, start_timeout: float) -> RendezvousClient:
    """A task's connection to the driver's control store."""
    return RendezvousClient(address.host, address.port, bytes.fromhex(address.secret_hex),
                            connect_timeout=start_timeout)


def host_worker(index: int, host: str, gpus: tuple[str, ...], address: ControlAddress, start_timeout: float) -> int:
    """Register as task `index` on `host`, run the worker the driver sends, return its exit code."""
    client = connect(address, start_timeout)
    try:
        client.put(control.TASKS, str(index), host.encode())
        argv, env = cloudpickle.loads(client.get(control.START, str(index), start_timeout))
        return run_worker(client, str(index), argv, env, gpus)
    finally:
        client.close()


class _Heartbeat:
    """Says "task `name` on `host` is alive" every `control.HEARTBEAT_SECONDS`, on a connection of
    its own (the task's is held by long waits), until stopped."""

    def __init__(self, address: ControlAddress, name: str, host: str, start_timeout: float) -> None:
        self._client = connect(address, start_timeout)
        self._name, self._host = name, host
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="hvd-spark-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        beat = 0
        while True:
            try:
                self._client.put(control.ALIVE, self._name, f"{self._host} {beat}".encode())
            except OSError:  # the driver's store is gone: the job is over
                return
            beat += 1
            if self._stopped.wait(control.HEARTBEAT_SECONDS):
                return

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._client.close()


def serve_elastic(name: str, host: str, gpus: tuple[str, ...], address: ControlAddress, start_timeout: float) -> int:
    """Be elastic task `name`: host the workers the driver sends, one after another, until it says
    the job is over (or its store is gone); the number of workers hosted."""
    client = connect(address, start_timeout)
    heartbeat = _Heartbeat(address, name, host, start_timeout)
    started = 0
    try:
        while not client.keys(control.DONE):
            key = control.worker_key(name, started)
            try:
                argv, env = cloudpickle.loads(client.get(control.START, key, _SIGNAL_POLL_SECONDS))
            except TimeoutError:
                continue
            run_worker(client, key, argv, env, gpus)
            started += 1
    except OSError:
        pass
    finally:
        heartbeat.stop()
        client.close()
    return started


def elastic_task(address: ControlAddress, start_timeout: float) -> Callable[[Iterable[Any]], Iterator[tuple[int, int]]]:
    """The function each task of `run_elastic` runs (`rdd.mapPartitions`): yields (partition,
    workers hosted). A task Spark runs again is a new elastic host (its attempt is in its name)."""

    def run(_rows: Iterable[Any]) -> Iterator[tuple[int, int]]:
        from pyspark import TaskContext

        context = TaskContext.get()
        name = control.task_name(context.partitionId(), context.attemptNumber())
        yield context.partitionId(), serve_elastic(name, socket.gethostname(), task_gpus(context), address,
                                                   start_timeout)

    return run


def barrier_task(address: ControlAddress, start_timeout: float) -> Callable[[Iterable[Any]], Iterator[tuple[int, int]]]:
    """The function each barrier task runs (`rdd.barrier().mapPartitions`): yields (index, exit code)."""

    def run(_rows: Iterable[Any]) -> Iterator[tuple[int, int]]:
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        index = context.partitionId()
        host = context.getTaskInfos()[index].address.rsplit(":", 1)[0]
        yield index, host_worker(index, host, task_gpus(context), address, start_timeout)

    return run
