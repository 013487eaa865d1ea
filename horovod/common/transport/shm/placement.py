"""Where the ranks of one host run: each local rank on a share of the cores of its own.

Ranks that talk through shared memory wake each other: a rank that sleeps in a collective is
woken by its peer's ring, a socket write, which the kernel treats as "the writer is about to
sleep, run the reader here". Its wake-affine placement then pulls the two ranks onto one core,
and as long as they keep waking each other they stay there, one running while the other waits:
a job that started that way ran at a fraction of its speed to the end (measured on the 2-core
development machine: both ranks of a slow job sat on the same core for every operation; see
docs/engineering-notes.md). Giving each local rank its own share of the cores, as `mpirun` binds
ranks to cores, takes that decision away from the phase of the job's first operations.

Only done where nobody placed the process already (its affinity is every core of the machine)
and every local rank can have a core; `HOROVOD_CPU_BINDING=0` turns it off. The original
affinity comes back when the transport closes, or as soon as the rank turns out to share its
core with other work (a data loader, another job): a bound rank cannot move away from a busy
process that the kernel put on its core, and its peers wait for it at every step, so from then
on the kernel places it.
"""

from __future__ import annotations

import os
import time

from horovod.common.logging import log
from horovod.common.partition import even_counts, offsets

_TASKS = "/proc/self/task"
# How often a bound rank looks at how long its threads waited to run, and the share of that time
# which other work must have taken on its cores for them to count as shared.
_REVIEW_SECONDS = 0.5
_CONTENDED = 0.25


def thread_times() -> dict[int, tuple[float, float]] | None:
    """Each thread of this process: (seconds running, seconds runnable but waiting), from the
    kernel's schedstat; None where the kernel does not say."""
    times: dict[int, tuple[float, float]] = {}
    try:
        threads = os.listdir(_TASKS)
    except OSError:
        return None
    for tid in threads:
        try:
            with open(f"{_TASKS}/{tid}/schedstat") as f:
                fields = f.read().split()
            times[int(tid)] = (int(fields[0]) / 1e9, int(fields[1]) / 1e9)
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        except (OSError, ValueError, IndexError):
            return None
    return times


def foreign_work(before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]) -> float:
    """The least time other processes must have run on this process's cores between two
    `thread_times`: while a thread waited, either another of our threads ran or someone else's
    did. Our own threads wait for each other too (the engine's thread behind a caller that spins
    on the core), and that must not count."""
    deltas = [(after[t][0] - before[t][0], after[t][1] - before[t][1]) for t in after.keys() & before.keys()]
    running = sum(run for run, _ in deltas)
    return max((wait - (running - run) for run, wait in deltas), default=0.0)


def _set_all_threads(cpus: set[int]) -> None:
    """Apply `cpus` to every thread of the process (the call itself affects only one thread)."""
    try:
        threads = [int(tid) for tid in os.listdir(_TASKS)]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # the thread ended meanwhile
            pass


class CoreShare:
    """This rank's share of the host's cores, held from `bind` until `release`."""

    def __init__(self) -> None:
        self.cpus: set[int] | None = None  # our share while bound
        self._original: set[int] | None = None
        self._next_review = 0.0  # when `contended` looks next (0: not bound)
        self._sample: tuple[float, dict[int, tuple[float, float]]] | None = None  # (time, thread_times) at the last look

    def bind(self, index: int, local_size: int) -> set[int] | None:
        """Restrict this process to local rank `index`'s share of the cores; the share, or None
        where the process is left where it is."""
        if not hasattr(os, "sched_setaffinity") or self.cpus is not None:
            return self.cpus
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) != os.cpu_count() or not 1 < local_size <= len(allowed):
            return None  # placed already (mpirun, srun, taskset), or fewer cores than ranks
        counts = even_counts(len(allowed), local_size)
        start = offsets(counts)[index]
        self._original, self.cpus = set(allowed), set(allowed[start: start + counts[index]])
        _set_all_threads(self.cpus)
        self._next_review = time.monotonic() + _REVIEW_SECONDS
        return self.cpus

    def contended(self) -> bool:
        """Called as operations run: True once, when other processes took more than
        `_CONTENDED` of the time since the last look on this bound rank's cores, keeping its
        threads waiting (`foreign_work`); the binding is released then. Looks at most every
        `_REVIEW_SECONDS`."""
        if not self._next_review or time.monotonic() < self._next_review:
            return False
        now, times = time.monotonic(), thread_times()
        if times is None:
            self._next_review = 0.0  # the kernel does not say: stay bound
            return False
        self._next_review = now + _REVIEW_SECONDS
        previous, self._sample = self._sample, (now, times)
        if previous is None:
            return False
        share = foreign_work(previous[1], times) / (now - previous[0])
        if share <= _CONTENDED:
            return False
        log.info("placement: other work kept this rank's threads waiting %.0f%% of the last %.1f s (its core "
                 "is shared); the kernel places it from now on", 100 * share, now - previous[0])
        self.release()
        return True

    def release(self) -> None:
        """Give the process back the cores it had before `bind`."""
        if self._original is not None:
            _set_all_threads(self._original)
            self._original = self.cpus = None
            self._next_review, self._sample = 0.0, None
