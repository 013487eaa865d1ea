"""mpirun's remote-shell agent under `horovod.spark.run(use_mpi=True)`: mpirun's daemon for a host
runs in a Spark task on that host.

Open MPI starts one daemon per host of the job by running `<agent> <host> <command>`, as it would
run ssh. `horovod.spark.runner` names each host of the job `task-<index>` after the first Spark
task on that executor host (names mpirun cannot take for its own machine, so it never forks a
daemon locally) and makes this module the agent. The agent sends the command to that task through
the driver's control store, where the task runs it as it runs any worker, and stands in for it:
shows its output, passes on SIGINT/SIGTERM, and exits with its exit code.

Usage (by mpirun): `python -m horovod.spark.mpirun_rsh <store host> <store port> task-<index>
<command...>`, with the store's secret in `_HOROVOD_SPARK_CONTROL_SECRET`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from horovod.common.settings import SPARK_CONTROL_SECRET_ENV, Settings
from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers import OutputOptions
from horovod.spark.control import ControlAddress
from horovod.spark.launcher import SparkWorker

HOST_PREFIX = "task-"


def host_name(task_index: int) -> str:
    """The name of the job's host whose daemon runs in Spark task `task_index`."""
    return f"{HOST_PREFIX}{task_index}"


def agent_command(address: ControlAddress) -> list[str]:
    """What mpirun runs as its agent (the secret goes in the environment, never here)."""
    return [sys.executable, "-m", "horovod.spark.mpirun_rsh", address.host, str(address.port)]


def main(argv: list[str]) -> int:
    if len(argv) < 4 or not argv[2].startswith(HOST_PREFIX):
        print(f"usage: python -m horovod.spark.mpirun_rsh <store host> <store port> {HOST_PREFIX}<index> "
              f"<command...> (run by mpirun under horovod.spark.run(use_mpi=True)), got {argv}", file=sys.stderr)
        return 2
    secret_hex = Settings.from_env().spark_control_secret_hex
    if not secret_hex:
        print("horovod.spark.mpirun_rsh: _HOROVOD_SPARK_CONTROL_SECRET is not set (only "
              "horovod.spark.run(use_mpi=True) runs this agent)", file=sys.stderr)
        return 2
    store_host, store_port, host, command = argv[0], int(argv[1]), argv[2], argv[3:]
    index = int(host[len(HOST_PREFIX):])
    # The daemon's own lines (its ranks' output reaches mpirun another way), tagged with its task.
    daemon = SparkWorker(SlotInfo(host, index, 0, 0, 1, 1, 1), str(index),
                         ControlAddress(store_host, store_port, secret_hex), OutputOptions())
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Sent from a thread: the handler may interrupt the main thread inside the store client.
        signal.signal(signum, lambda received, _frame: threading.Thread(target=daemon.signal, args=(received,)).start())
    # The daemon's environment is its ranks': the store's secret stays with the agent.
    env = {name: value for name, value in os.environ.items() if name != SPARK_CONTROL_SECRET_ENV}
    daemon.send(("/bin/sh", "-c", " ".join(command)), env)
    returncode = daemon.wait()
    daemon.join_output(5.0)
    return 255 if returncode is None else (returncode if returncode >= 0 else 128 - returncode)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
