"""The local launcher: a worker on this machine is a child process of the launcher."""

from __future__ import annotations

from typing import Mapping

from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers.base import SECRET_KEY_ENV, LaunchContext
from horovod.runner.launchers.process import ProcessWorker


class LocalLauncher:
    """Starts workers as child processes; the secret travels in their environment."""

    def __init__(self, context: LaunchContext) -> None:
        self.context = context

    def start(self, slot: SlotInfo, env: Mapping[str, str]) -> ProcessWorker:
        ctx = self.context
        return ProcessWorker(slot, ctx.command, {**env, SECRET_KEY_ENV: ctx.secret_hex},
                             cwd=ctx.cwd, output=ctx.output, guard=ctx.guard)
