"""A worker that is a process of this machine: start it, forward its output, signal it, reap it.

Both the local and the ssh launcher end in one of these (for ssh, the process is the ssh client
that runs the remote worker). No policy here: see `horovod.runner.launchers.base`. Each worker
runs in its own session (so its own process group): a signal to the group reaches whatever the
worker started too, and a Ctrl-C typed at the terminal reaches only the launcher, which then
stops the workers in order; should the launcher die without doing so, the job's orphan guard
(`horovod.runner.launchers.orphans`) stops them.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from typing import IO, Mapping, Sequence

from horovod.runner.hosts import SlotInfo
from horovod.runner.launchers.base import OutputOptions
from horovod.runner.launchers.orphans import OrphanGuard

# One lock for both consoles, so lines of different ranks never interleave mid-line.
_console_lock = threading.Lock()


def rank_output_dir(output_dir: str, rank: int, size: int) -> str:
    """`DIR/rank.<rank>`, the rank zero-padded to the width of the largest rank."""
    return os.path.join(output_dir, f"rank.{rank:0{len(str(size - 1))}d}")


def forward_line(rank: int, name: str, line: str, output: OutputOptions) -> None:
    """Show one line (ending in a newline) that rank `rank` wrote to `name` ("stdout"/"stderr") on
    our own stream of that name, prefixed `[rank]<name>:` as Horovod does."""
    stamp = time.asctime() if output.prefix_timestamp else ""
    with _console_lock:
        try:
            stream = getattr(sys, name)  # looked up late: callers may redirect it
            stream.write(f"{stamp}[{rank}]<{name}>:{line}")
            stream.flush()
        except (OSError, ValueError):
            pass  # our console is gone (closed pipe); keep draining the worker


class ProcessWorker:
    """One launched process (a local worker, or the ssh client of a remote one) and its output.

    Implements `horovod.runner.launchers.base.WorkerProcess`.
    """

    def __init__(
        self,
        slot: SlotInfo,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None = None,
        stdin_data: bytes | None = None,
        output: OutputOptions = OutputOptions(),
        guard: OrphanGuard | None = None,
        keep_stdin_open: bool = False,
    ) -> None:
        self.slot = slot
        self._output = output
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=output.tail_lines)
        files = self._open_output_files()
        self.proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if stdin_data is not None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(stdin_data)
                self.proc.stdin.flush()
                if not keep_stdin_open:
                    self.proc.stdin.close()
            except BrokenPipeError:
                pass
        if guard is not None:
            guard.watch(self.proc.pid, slot.rank, slot.hostname)
        streams = ((self.proc.stdout, "stdout", files[0]), (self.proc.stderr, "stderr", files[1]))
        self._pumps = [
            threading.Thread(target=self._pump, args=stream, name=f"hvd-{stream[1]}-{slot.rank}",
                             daemon=True)
            for stream in streams
        ]
        for pump in self._pumps:
            pump.start()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # the end of a connection kept open while it ran (ssh)
            except OSError:
                pass
        return returncode

    def signal(self, signum: int) -> None:
        """Signal the worker's whole process group (it may be gone already; that is fine)."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def join_output(self, timeout: float) -> None:
        """Wait until both pipes are drained, so nothing a worker printed is lost."""
        deadline = time.monotonic() + timeout
        for pump in self._pumps:
            pump.join(max(0.0, deadline - time.monotonic()))

    def stderr_tail(self) -> list[str]:
        return list(self._stderr_tail)

    def _open_output_files(self) -> tuple[IO[bytes] | None, IO[bytes] | None]:
        if self._output.output_dir is None:
            return None, None
        directory = rank_output_dir(self._output.output_dir, self.slot.rank, self.slot.size)
        os.makedirs(directory, exist_ok=True)
        return (open(os.path.join(directory, "stdout"), "wb"),
                open(os.path.join(directory, "stderr"), "wb"))

    def _pump(self, pipe: IO[bytes], name: str, file: IO[bytes] | None) -> None:
        """Copy one pipe line by line to our own stdout/stderr (and the rank's file)."""
        try:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                if not line.endswith("\n"):  # the last line of a process that did not end it
                    line += "\n"
                if name == "stderr":
                    self._stderr_tail.append(line[:-1])
                forward_line(self.slot.rank, name, line, self._output)
                if file is not None:
                    file.write(raw)
                    file.flush()
        finally:
            pipe.close()
            if file is not None:
                file.close()

