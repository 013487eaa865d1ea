"""How a job ended, in words: the first failure, the exit status, the summary printed last.

Apart from `horovod.runner.job` because it is the report, not the policy: `horovodrun` and
`horovod.run` print it, and a driver that restarts jobs (elastic) can reuse it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Collection, Sequence


def describe_returncode(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def how_it_went(returncode: int) -> str:
    """A worker's end as the other ranks are told it: 'exited with exit code 3', 'was killed by ...'."""
    return f"was {describe_returncode(returncode)}" if returncode < 0 else f"exited with {describe_returncode(returncode)}"


def exit_status(returncode: int) -> int:
    """The launcher's own exit status for a worker's return code (128+N for signal N, as shells do)."""
    return returncode if returncode > 0 else 128 - returncode


def root_cause(failed: Sequence[int], reports: Collection[str]) -> int:
    """Which failed rank to name as the first failure.

    `failed` lists the ranks that failed by themselves, in the order the launcher saw them exit;
    `reports` are the keys of the store's `failures` scope. Exit order alone is a race: the rank
    that raised may still be exiting when a peer, told that it left, has already failed and
    exited. So a rank that recorded its own exception comes first, then one that recorded nothing
    (it crashed or was killed), and last one whose error came after it saw peers leave
    (`after.<rank>`, a consequence); within each, the first to exit.
    """
    def tier(rank: int) -> int:
        if f"after.{rank}" in reports:
            return 2
        return 0 if str(rank) in reports else 1

    return min(failed, key=lambda rank: (tier(rank), failed.index(rank)))


@dataclass(frozen=True)
class WorkerFailure:
    """The first worker that exited non-zero, with what we know about why."""

    rank: int
    hostname: str
    local_rank: int
    returncode: int
    stderr_tail: tuple[str, ...] = ()
    reported_exception: str | None = None
    other_reporting_ranks: tuple[int, ...] = ()
    reason: str | None = None  # why the launcher stopped it, when it did not fail by itself


@dataclass(frozen=True)
class JobResult:
    exit_code: int
    failure: WorkerFailure | None = None
    signal_received: int | None = None
    reason: str | None = None  # why the job was stopped when no worker failure explains it (elastic)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def format_failure(failure: WorkerFailure) -> str:
    """The summary printed last, so the cause is the first thing a user sees when scrolling up."""
    lines = [
        "Horovod detected that one or more processes exited with non-zero status, so the job "
        "was stopped. The first process to fail was:",
        f"    rank {failure.rank} on host {failure.hostname} (local rank {failure.local_rank}): "
        f"{failure.reason or describe_returncode(failure.returncode)}",
    ]
    if failure.reported_exception:
        lines.append(f"Root cause, the exception rank {failure.rank} reported:")
        lines += ["    " + line for line in failure.reported_exception.rstrip().splitlines()]
    tail = failure.stderr_tail
    if failure.reported_exception:
        reported = {line.strip() for line in failure.reported_exception.splitlines()}
        if all(line.strip() in reported for line in tail):
            tail = ()  # the stderr tail is only the traceback already shown
    if tail:
        lines.append(f"Last {len(tail)} lines of rank {failure.rank}'s stderr:")
        lines += ["    " + line for line in tail]
    elif not failure.reported_exception:
        lines.append(f"Rank {failure.rank} wrote nothing to stderr.")
    if failure.other_reporting_ranks:
        ranks = ", ".join(str(rank) for rank in failure.other_reporting_ranks)
        lines.append(f"Other ranks that reported an exception: {ranks}.")
    return "\n".join(lines)


def format_result(result: JobResult) -> str | None:
    """What the launcher prints at the end of a job that did not succeed (None when it did)."""
    if result.failure is not None:
        text = format_failure(result.failure)
        return f"{text}\nThe elastic job stopped because {result.reason}." if result.reason else text
    if result.reason is not None:
        return f"The job was stopped: {result.reason}." 
    if result.signal_received is not None:
        name = signal.Signals(result.signal_received).name
        return f"horovodrun received {name}; all worker processes were stopped."
    return None
