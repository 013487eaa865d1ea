"""How the Spark driver and its barrier tasks talk: a rendezvous store of their own, and its keys.

`horovod.spark.run` starts one barrier task per rank. The tasks cannot be reached from the driver
(Spark decides where they run), so they connect to an authenticated store that the driver serves
(`horovod.common.rendezvous`, the same server the workers meet in) and everything goes through
it, keyed by the task's partition index:

| scope | key | value | written by |
|---|---|---|---|
| `spark.tasks` | `<index>` | UTF-8 host the task runs on | task, once started |
| `spark.start` | `<index>` | cloudpickled `(argv, env)` of the worker to start | driver (`SparkLauncher`) |
| `spark.signal` | `<index>.<n>` | UTF-8 signal number, the n-th signal for that worker | driver |
| `spark.output` | `<index>.<n>` | wire-encoded `(stream name, line)`, the n-th line | task |
| `spark.output` | `<index>.end` | UTF-8 count of lines once the worker's pipes are drained | task |
| `spark.exit` | `<index>` | UTF-8 return code of the worker | task, or the driver for a task that Spark lost |

In an elastic job (`run_elastic`) a task is known by its name (`task_name`: partition and attempt,
so a task Spark runs again is a new host) and may host several workers in turn, each keyed
`<name>.<n>` (`worker_key`) in the scopes above; two more scopes say who is alive and when to stop:

| scope | key | value | written by |
|---|---|---|---|
| `spark.alive` | `<name>` | UTF-8 `<host> <beat>`, the beat counting up every `HEARTBEAT_SECONDS` | task |
| `spark.done` | `job` | empty: the job is over, tasks return | driver |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

TASKS = "spark.tasks"
START = "spark.start"
SIGNAL = "spark.signal"
OUTPUT = "spark.output"
EXIT = "spark.exit"
ALIVE = "spark.alive"
DONE = "spark.done"

#: How often an elastic task says it is alive, and how long the driver waits before it counts a
#: silent one as gone (its Python process died, or its executor did).
HEARTBEAT_SECONDS = 0.5
HEARTBEAT_TIMEOUT_SECONDS = 5.0

#: The return code reported for a worker whose Spark task ended without saying how it went.
LOST_TASK = 255


def task_name(partition: int, attempt: int) -> str:
    """An elastic task's name, its host name in the elastic driver."""
    return f"task-{partition}-{attempt}"


def worker_key(task: str, started: int) -> str:
    """The key of the `started`-th worker (from 0) that elastic task `task` hosts."""
    return f"{task}.{started}"


@dataclass(frozen=True)
class ControlAddress:
    """Where the driver's control store listens, and its secret (hex): all a task needs."""

    host: str
    port: int
    secret_hex: str

    def as_options(self) -> dict[str, str]:
        """The form `LaunchContext.launcher_options` carries to the Spark launcher."""
        return {"control_host": self.host, "control_port": str(self.port), "control_secret": self.secret_hex}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "ControlAddress":
        return cls(options["control_host"], int(options["control_port"]), options["control_secret"])
