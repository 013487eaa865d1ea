"""mpirun's output, shown the way `--prefix-output-with-timestamp` and `--output-filename` ask.

mpirun tags every line with its rank (Open MPI's `--tag-output`: `[1,3]<stdout>: text`; Hydra's
`-l`: `[3] text`). We read both of mpirun's streams, print each line as it came (after the time
when asked) and copy its text into `DIR/rank.<rank>/stdout` or `stderr`: the layout the Gloo
launcher writes, for every MPI flavour. The MPIs' own options differ too much to forward: Open
MPI 5's `--output-filename` writes `DIR.<job>.<rank>.out` files and stops the console copy, and
Hydra has no timestamps at all. Lines without a rank tag (mpirun's own messages) go to the console.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import IO

from horovod.runner.launchers.base import OutputOptions
from horovod.runner.launchers.process import rank_output_dir

_OPEN_MPI_TAG = re.compile(rb"^\[\d+,(\d+)\]<std(?:out|err)>: ?")
_HYDRA_TAG = re.compile(rb"^\[(\d+)\] ?")


def split_tag(line: bytes, open_mpi: bool) -> tuple[int | None, bytes]:
    """(rank, text) of one tagged line; (None, line) for a line mpirun wrote itself."""
    match = (_OPEN_MPI_TAG if open_mpi else _HYDRA_TAG).match(line)
    return (int(match[1]), line[match.end():]) if match else (None, line)


class TaggedOutput:
    """Forwards mpirun's two streams; a context manager that closes the rank files it opened."""

    def __init__(self, open_mpi: bool, size: int, output: OutputOptions) -> None:
        self._open_mpi = open_mpi
        self._size = size
        self._output = output
        self._files: dict[tuple[int, str], IO[bytes]] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> "TaggedOutput":
        return self

    def __exit__(self, *exc: object) -> None:
        for file in self._files.values():
            file.close()

    def pump(self, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        """Forward both streams until mpirun closes them."""
        readers = [threading.Thread(target=self._forward, args=(pipe, name), name=f"hvd-mpirun-{name}", daemon=True)
                   for pipe, name in ((stdout, "stdout"), (stderr, "stderr"))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()

    def _forward(self, pipe: IO[bytes], name: str) -> None:
        console = getattr(sys, name)
        for line in iter(pipe.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            stamp = time.asctime() if self._output.prefix_timestamp else ""
            with self._lock:
                try:
                    console.write(stamp + line.decode("utf-8", errors="replace"))
                    console.flush()
                except (OSError, ValueError):
                    pass  # our console is gone: keep draining mpirun
                rank, text = split_tag(line, self._open_mpi)
                if rank is not None and self._output.output_dir is not None:
                    file = self._rank_file(rank, name)
                    file.write(text)
                    file.flush()
        pipe.close()

    def _rank_file(self, rank: int, name: str) -> IO[bytes]:
        if (rank, name) not in self._files:
            directory = rank_output_dir(self._output.output_dir or "", rank, self._size)
            os.makedirs(directory, exist_ok=True)
            self._files[(rank, name)] = open(os.path.join(directory, name), "wb")
        return self._files[(rank, name)]
