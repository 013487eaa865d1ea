"""Horovod flags that `horovodrun` accepts although nothing stands behind them here yet.

Horovod command lines and config files must keep working, so these flags still parse (and still
export their variables, for a worker that reads them itself); but nobody should believe they took
effect. So `--help` says so, and horovodrun warns once per flag that asks for something, whether
it came from the command line or the config file. A flag leaves this table when its feature lands.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import Any

from horovod.runner import config_file

log = logging.getLogger("horovod.runner")

_HELP_PREFIX = "Accepted, but has no effect here yet (horovodrun warns when it is given). In Horovod: "


@dataclass(frozen=True)
class NoopFlag:
    """One flag without an effect: its argparse dest, how users spell it, and why it does nothing."""

    dest: str
    flag: str
    why: str


NOOP_FLAGS: tuple[NoopFlag, ...] = (
    NoopFlag("disable_cache", "--disable-cache", "this launcher keeps no cache to disable"),
    NoopFlag("torus_allreduce", "--torus-allreduce",
             "the NCCL path runs one communicator across the hosts; the two-level torus is not implemented"),
    NoopFlag("mpi_threads_disable", "--mpi-threads-disable",
             "the MPI path always needs MPI_THREAD_MULTIPLE (the engine calls MPI from two threads)"),
    NoopFlag("num_nccl_streams", "--num-nccl-streams", "the NCCL path queues its work on one stream per rank"),
    NoopFlag("thread_affinity", "--thread-affinity", "the background thread is not pinned to a core"),
)


def _asks_for_something(value: Any) -> bool:
    """A flag left unset, or a switch turned off (`--no-...`), asks for nothing we lack."""
    return value is not None and value is not False


def mark_help(parser: argparse.ArgumentParser) -> None:
    """Start the help of every flag in the table by saying that it has no effect here."""
    flags = {noop.flag for noop in NOOP_FLAGS}
    for action in parser._actions:
        if flags & set(action.option_strings):
            action.help = _HELP_PREFIX + (action.help or "")


def warn_noop_flags(args: argparse.Namespace) -> None:
    """Warn once for each flag of the table that `args` sets (from the command line or the file)."""
    for noop in NOOP_FLAGS:
        if not _asks_for_something(getattr(args, noop.dest, None)):
            continue
        key = config_file.key_of(noop.dest)
        spelled = f"{noop.flag} (or {key} in a config file)" if key else noop.flag
        log.warning("%s is accepted but has no effect here: %s", spelled, noop.why)
