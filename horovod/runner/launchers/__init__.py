"""How workers get started: one interface (`base`), implementations chosen by name (`registry`).

`local` runs a worker as a child process of the launcher, `ssh` on another host through ssh.
The failure policy that uses them is `horovod.runner.job`.
"""

from horovod.runner.launchers.base import (
    SECRET_KEY_ENV,
    LaunchContext,
    Launcher,
    OutputOptions,
    WorkerProcess,
    stop_all,
)
from horovod.runner.launchers.registry import create, default_name

__all__ = ["SECRET_KEY_ENV", "LaunchContext", "Launcher", "OutputOptions", "WorkerProcess",
           "create", "default_name", "stop_all"]
