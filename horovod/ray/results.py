"""Gathering one call's results from every worker, with rank 0's reports and the failure policy.

The policy is horovodrun's (`horovod.runner.job`): a failed rank is reported with its node and
traceback; the others get `grace_seconds` to notice (their Horovod fails naming it) and are
then given up on; among several failures, the root cause is named first
(`horovod.runner.report.root_cause`: a rank that failed after seeing a peer leave comes last).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from horovod.ray.worker import WorkerError
from horovod.runner.report import root_cause

_POLL_SECONDS = 0.1


class Reporting:
    """A queue for `horovod.ray.report` while one call runs (only when there are callbacks)."""

    def __init__(self, callbacks: Sequence[Callable[[Any], None]] | None) -> None:
        self.callbacks = list(callbacks or [])
        self.queue: Any = None

    def __enter__(self) -> "Reporting":
        if self.callbacks:
            from ray.util.queue import Queue

            self.queue = Queue(actor_options={"num_cpus": 0})
        return self

    def drain(self) -> None:
        """Hand every value reported so far to each callback, in order."""
        if self.queue is None:
            return
        while not self.queue.empty():
            value = self.queue.get()
            for callback in self.callbacks:
                callback(value)

    def __exit__(self, *exc: object) -> None:
        if self.queue is not None:
            self.queue.shutdown(force=True)
            self.queue = None


@dataclass
class Outcome:
    values: list[Any]
    failures: dict[int, str] = field(default_factory=dict)  # rank -> what went wrong, in failing order
    departed: dict[int, tuple[int, ...]] = field(default_factory=dict)
    stuck: list[int] = field(default_factory=list)  # ranks that never finished after a failure

    def values_or_raise(self) -> list[Any]:
        if not self.failures:
            return self.values
        reports = {str(rank) for rank in self.failures} | {f"after.{rank}" for rank, seen in self.departed.items()
                                                           if seen}
        first = root_cause(list(self.failures), reports)
        lines = [self.failures[first]]
        others = [rank for rank in self.failures if rank != first]
        if others:
            lines.append(f"({_ranks(others)} failed too, after rank {first})")
        if self.stuck:
            lines.append(f"({_ranks(self.stuck)} had not finished; the executor was shut down to stop "
                         "them: start() it again to go on)")
        raise RuntimeError("\n".join(lines))


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def collect(refs: Sequence[Any], node_ids: Sequence[str], reporting: Reporting,
            grace_seconds: float) -> Outcome:
    """Wait for every rank's result (refs by rank), forwarding reports, and note who failed how."""
    outcome = Outcome([None] * len(refs))
    pending = {ref: rank for rank, ref in enumerate(refs)}
    first_failure: float | None = None
    while pending:
        reporting.drain()
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_SECONDS)
        for ref in ready:
            rank = pending.pop(ref)
            try:
                outcome.values[rank] = ray.get(ref)
            except RayTaskError as exc:
                cause = exc.cause if isinstance(exc.cause, WorkerError) else None
                outcome.failures[rank] = str(cause) if cause is not None else str(exc)
                outcome.departed[rank] = cause.departed if cause is not None else ()
            except RayActorError as exc:
                outcome.failures[rank] = f"rank {rank} on Ray node {node_ids[rank]} died: {exc}"
        if outcome.failures and first_failure is None:
            first_failure = time.monotonic()
        if pending and first_failure is not None and time.monotonic() - first_failure > grace_seconds:
            outcome.stuck = sorted(pending.values())
            break
    reporting.drain()
    return outcome
