"""The Spark launcher: a worker runs in a barrier task that the driver reaches through a store.

`SparkLauncher.start(slot, env)` sends the worker's command and environment to the task that
hosts the slot (`spark.start`); the `SparkWorker` it returns is the `WorkerProcess` the failure
policy (`horovod.runner.job`) sees: it reads the exit code the task reports, forwards signals,
and shows the lines the task streams back as `[rank]<stdout>:` lines, like a local worker's.
Which task hosts which slot is the placement `horovod.spark.runner` decided from the hosts the
tasks registered (`launcher_options["placement"]`: JSON `{host: [task index by local rank]}`);
in an elastic job (`ElasticSparkLauncher`) each host is a task of its own.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from typing import Mapping

import cloudpickle

from horovod.common import wire
from horovod.common.rendezvous import RendezvousClient
from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers.base import SECRET_KEY_ENV, LaunchContext, OutputOptions
from horovod.runner.launchers.process import forward_line
from horovod.spark import control
from horovod.spark.control import ControlAddress

_POLL_SECONDS = 0.2


def _client(address: ControlAddress) -> RendezvousClient:
    return RendezvousClient(address.host, address.port, bytes.fromhex(address.secret_hex))


class SparkWorker:
    """One worker in a Spark task, as `horovod.runner.launchers.base.WorkerProcess`."""

    def __init__(self, slot: SlotInfo, key: str, address: ControlAddress, output: OutputOptions) -> None:
        self.slot, self.key = slot, key
        self._address, self._output = address, output
        self._client = _client(address)  # short requests only: blocking waits would hold its lock
        self._returncode: int | None = None
        self._signals = 0
        self._signal_lock = threading.Lock()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=output.tail_lines)
        self._pump = threading.Thread(target=self._forward_output, name=f"hvd-spark-output-{slot.rank}",
                                      daemon=True)

    def send(self, argv: tuple[str, ...], env: Mapping[str, str]) -> None:
        """Hand the worker to its task, and start showing what it prints."""
        self._client.put(control.START, self.key, cloudpickle.dumps((list(argv), dict(env))))
        self._pump.start()

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._returncode is None:
            left = _POLL_SECONDS if deadline is None else min(_POLL_SECONDS, deadline - time.monotonic())
            try:
                value = self._client.get(control.EXIT, self.key, max(0.0, left))
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            except OSError:  # the control store is gone: the job is over
                return self._returncode
            self._returncode = int(value)
        return self._returncode

    def signal(self, signum: int) -> None:
        if self._returncode is not None:
            return
        with self._signal_lock:
            try:
                self._client.put(control.SIGNAL, f"{self.key}.{self._signals}", str(signum).encode())
            except OSError:
                return
            self._signals += 1

    def join_output(self, timeout: float) -> None:
        if self._pump.is_alive():
            self._pump.join(timeout)

    def stderr_tail(self) -> list[str]:
        return list(self._stderr_tail)

    def _forward_output(self) -> None:
        """Show the task's lines in order until it says there are no more, or the store goes."""
        try:
            client = _client(self._address)
        except OSError:
            return
        try:
            line_no = 0
            while True:
                try:
                    name, raw = wire.decode(client.get(control.OUTPUT, f"{self.key}.{line_no}", _POLL_SECONDS))
                except TimeoutError:
                    if self._no_more_lines(client, line_no):
                        return
                    continue
                line_no += 1
                line = raw.decode("utf-8", errors="replace")
                line = line if line.endswith("\n") else line + "\n"
                if name == "stderr":
                    self._stderr_tail.append(line[:-1])
                forward_line(self.slot.rank, name, line, self._output)
        except OSError:
            return
        finally:
            client.close()

    def _no_more_lines(self, client: RendezvousClient, line_no: int) -> bool:
        """All lines shown, or the task is gone without saying how many there were."""
        if f"{self.key}.end" in client.keys(control.OUTPUT):
            return int(client.get(control.OUTPUT, f"{self.key}.end", 0.0)) <= line_no
        return self.key in client.keys(control.EXIT) and self._returncode == control.LOST_TASK


class SparkLauncher:
    """Starts each worker in the Spark task the placement gives its slot; see the module docstring."""

    def __init__(self, context: LaunchContext) -> None:
        self.context = context
        self._address = ControlAddress.from_options(context.launcher_options)
        self._placement: dict[str, list[int]] = json.loads(context.launcher_options["placement"])

    def start(self, slot: SlotInfo, env: Mapping[str, str]) -> SparkWorker:
        ctx = self.context
        worker = SparkWorker(slot, str(self._placement[slot.hostname][slot.local_rank]), self._address, ctx.output)
        worker.send(ctx.command, {**env, SECRET_KEY_ENV: ctx.secret_hex})
        return worker


class ElasticSparkLauncher:
    """`run_elastic`'s launcher: each host is one Spark task (its name, `control.task_name`) that
    may host one worker after another: the n-th worker started there has key `<task>.<n>`."""

    def __init__(self, context: LaunchContext) -> None:
        self.context = context
        self._address = ControlAddress.from_options(context.launcher_options)
        self._started: collections.Counter[str] = collections.Counter()

    def start(self, slot: SlotInfo, env: Mapping[str, str]) -> SparkWorker:
        ctx = self.context
        key = control.worker_key(slot.hostname, self._started[slot.hostname])
        self._started[slot.hostname] += 1
        worker = SparkWorker(slot, key, self._address, ctx.output)
        worker.send(ctx.command, {**env, SECRET_KEY_ENV: ctx.secret_hex})
        return worker
