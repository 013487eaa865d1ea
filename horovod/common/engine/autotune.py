"""Autotune (HOROVOD_AUTOTUNE=1): the engine searches for the fusion threshold, cycle time and
switches that move the most allreduce bytes per second in this job, then keeps the best.

Every rank counts the allreduces of the global set as they run (every rank runs the same ones),
so all of them see a *sample* close at the same cycle: when some tensor has been reduced
`steps_per_sample` times since the last one. Then rank 0, the only one that decides, scores the
sample (allreduced bytes per microsecond, on its clock) and broadcasts the knobs every rank uses
from the next cycle on. After `warmup_samples` discarded samples, each configuration is scored
as the median of SAMPLES_PER_CONFIG samples. The search is Horovod's chain of stages: fusion
threshold and cycle time together by Bayesian optimisation (seeded with fixed first points, at
most `bayes_opt_max_samples` configurations), then each on/off switch tried both ways
(hierarchical allreduce and allgather where the job spans hosts, the response cache). A knob
the user set explicitly is never tuned. Rank 0 logs every configuration to the CSV file
(HOROVOD_AUTOTUNE_LOG), and the chosen one last.
"""

from __future__ import annotations

import abc
import dataclasses
import statistics
import time
from collections import Counter
from typing import Callable
from horovod.common.engine.bayesian import BayesianOptimizer, require_scikit_learn
from horovod.common.engine.messages import OpType, Response
from horovod.common.engine.tunables import Tunables
from horovod.common.logging import log
from horovod.common.reduce_ops import SUPPORTED_DTYPES
from horovod.common.settings import AutotuneSettings

SAMPLES_PER_CONFIG = 5
_MIB = 1024 * 1024
# Horovod's search box for the joint stage, and its first points: (fusion threshold MiB, cycle ms).
_BOUNDS = {"fusion_threshold": (0.0, 64.0), "cycle_time_ms": (1.0, 100.0)}
_SEEDS = ((4.0, 5.0), (32.0, 50.0), (16.0, 25.0), (8.0, 10.0))
LOG_HEADER = ("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,cycle_time_ms,"
              "tensor_fusion_threshold,score")
Values = dict[str, object]


class _Stage(abc.ABC):
    """One link of the search chain: proposes values to score and remembers how they did."""

    def __init__(self) -> None:
        self.tried: list[tuple[Values, float]] = []

    @abc.abstractmethod
    def propose(self) -> Values | None:
        """The next values to score, or None when this stage has seen enough."""

    def observe(self, values: Values, score: float) -> None:
        self.tried.append((values, score))

    def best(self) -> tuple[Values, float]:
        return max(self.tried, key=lambda t: t[1])


class _Joint(_Stage):
    """The continuous knobs the user left free, searched together with a Gaussian process."""

    def __init__(self, names: list[str], max_samples: int, noise: float) -> None:
        super().__init__()
        self.names = names
        index = [list(_BOUNDS).index(n) for n in names]
        self.seeds = [[seed[i] for i in index] for seed in _SEEDS]
        self.optimizer = BayesianOptimizer([_BOUNDS[n] for n in names], noise)
        self.max_samples = max_samples

    def propose(self) -> Values | None:
        n = len(self.tried)
        if n >= self.max_samples:
            return None
        point = self.seeds[n] if n < len(self.seeds) else self.optimizer.suggest()
        return {name: int(v * _MIB) if name == "fusion_threshold" else float(v) for name, v in zip(self.names, point)}

    def observe(self, values: Values, score: float) -> None:
        super().observe(values, score)
        self.optimizer.add([float(values[n]) / (_MIB if n == "fusion_threshold" else 1) for n in self.names], score)


class _Switch(_Stage):
    """An on/off knob: both tried, the better kept."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def propose(self) -> Values | None:
        return {self.name: (False, True)[len(self.tried)]} if len(self.tried) < 2 else None


class Autotuner:
    """Counts the global set's allreduces on every rank; on rank 0 also scores and decides."""

    def __init__(self, config: AutotuneSettings, tunables: Tunables, transport_knobs: tuple[str, ...],
                 rank: int, clock: Callable[[], float] = time.monotonic) -> None:
        require_scikit_learn()
        self.clock = clock  # what a sample's duration is measured with (tests pass their own)
        self.config = config
        self.rank = rank
        self.base = dataclasses.replace(tunables)  # the knobs of finished stages are folded in here
        free = [n for n in _BOUNDS if n not in config.fixed]
        self.stages: list[_Stage] = []
        if rank == 0:
            if free:
                self.stages.append(_Joint(free, config.bayes_opt_max_samples, config.gaussian_process_noise))
            self.stages += [_Switch(n) for n in transport_knobs if n not in config.fixed]
            if tunables.cache_enabled and "cache_enabled" not in config.fixed:
                self.stages.append(_Switch("cache_enabled"))
        self.warmup = config.warmup_samples
        self.testing: Values | None = None
        self.best_score: float | None = None
        self.scores: list[float] = []
        self.counts: Counter[str] = Counter()
        self.bytes = 0
        self.started = clock()
        if rank == 0 and config.log_file:
            with open(config.log_file, "w") as f:
                f.write(LOG_HEADER + "\n")

    def record(self, response: Response) -> None:
        """Count one executed response of the global set."""
        if response.op_type == OpType.ALLREDUCE:
            self.counts.update(response.names)
            self.bytes += response.tensor_bytes(SUPPORTED_DTYPES[response.dtype].itemsize)

    def sample_closed(self) -> bool:
        """True (the same cycle on every rank) when a sample has just closed: time to synchronise."""
        return bool(self.counts) and max(self.counts.values()) >= self.config.steps_per_sample

    def decide(self) -> tuple[bool, Tunables]:
        """Rank 0, at a sample's close: (still tuning?, the knobs every rank uses from now on)."""
        now = self.clock()
        score = self.bytes / max((now - self.started) * 1e6, 1e-9)  # bytes per microsecond
        self.counts.clear()
        self.bytes, self.started = 0, now
        if self.warmup > 0:
            self.warmup -= 1
            return True, self.current()
        if self.testing is not None:
            self.scores.append(score)
            if len(self.scores) < SAMPLES_PER_CONFIG:
                return True, self.current()
            median = statistics.median(self.scores)
            self.scores = []
            self._log(self.current(), median)
            self.stages[0].observe(self.testing, median)
        self.testing = self._next()
        if self.testing is None:  # every stage is done: keep the best
            log.info("autotune finished: %s", self.base)
            self._log(self.base, self.best_score)
            return False, self.base
        return True, self.current()

    def _next(self) -> Values | None:
        while self.stages:
            values = self.stages[0].propose()
            if values is not None:
                return values
            values, self.best_score = self.stages.pop(0).best()
            self.base = dataclasses.replace(self.base, **values)
        return None

    def current(self) -> Tunables:
        return dataclasses.replace(self.base, **(self.testing or {}))

    def reset_sample(self) -> None:
        """On the ranks that do not decide: start counting the next sample."""
        self.counts.clear()

    def _log(self, knobs: Tunables, score: float | None) -> None:
        if not self.config.log_file:
            return
        row = [int(bool(knobs.hierarchical_allreduce)), int(bool(knobs.hierarchical_allgather)), 0,
               int(knobs.cache_enabled), f"{knobs.cycle_time_ms:g}", f"{knobs.fusion_threshold / _MIB:g}",
               "" if score is None else f"{score:.6g}"]
        with open(self.config.log_file, "a") as f:
            f.write(",".join(str(v) for v in row) + "\n")
