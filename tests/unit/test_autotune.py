"""The autotuner's decisions on a simulated job (a made-up throughput per configuration, a fake
clock), and the Bayesian optimiser on its own: the chain of stages, warm-up, fixed knobs, the
CSV log, and that the search ends near the best configuration."""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest

pytest.importorskip("sklearn")

from horovod.common.engine.autotune import LOG_HEADER, SAMPLES_PER_CONFIG, Autotuner  # noqa: E402
from horovod.common.engine.bayesian import BayesianOptimizer  # noqa: E402
from horovod.common.engine.messages import OpType, Response  # noqa: E402
from horovod.common.engine.tunables import Tunables  # noqa: E402
from horovod.common.settings import AutotuneSettings  # noqa: E402

MIB = 1024 * 1024
STEP = Response(OpType.ALLREDUCE, ["grad"], "float32", [(256 * 1024,)])  # 1 MiB a step
BAD = Tunables(fusion_threshold=64 * 1024, cycle_time_ms=90.0, cache_enabled=True,
               hierarchical_allreduce=None, hierarchical_allgather=None)


def throughput(knobs: Tunables) -> float:
    """MiB/s of a made-up job: best at a 20 MiB threshold and a 3 ms cycle, 5% better with the cache."""
    mb, ms = knobs.fusion_threshold / MIB, knobs.cycle_time_ms
    return 100.0 * (1.5 - ((mb - 20) / 64) ** 2 - ((ms - 3) / 100) ** 2) * (1.05 if knobs.cache_enabled else 1.0)


def simulate(config: AutotuneSettings, start: Tunables = BAD, knobs: tuple[str, ...] = ()):
    now = [0.0]
    tuner = Autotuner(config, start, knobs, rank=0, clock=lambda: now[0])
    current, history, samples = start, [], 0
    while samples < 1000:
        tuner.record(STEP)
        now[0] += 1.0 / throughput(current)  # one step of 1 MiB at the current speed
        if tuner.sample_closed():
            samples += 1
            active, current = tuner.decide()
            history.append(current)
            if not active:
                return current, history, samples
    raise AssertionError("autotune never finished")


def test_search_ends_near_the_best_and_logs_every_configuration(tmp_path):
    log = tmp_path / "tune.csv"
    config = AutotuneSettings(enabled=True, log_file=str(log), warmup_samples=2, steps_per_sample=3,
                              bayes_opt_max_samples=12)
    final, history, samples = simulate(config)
    assert history[:2] == [BAD, BAD]  # warm-up samples change nothing
    assert throughput(final) >= 0.95 * throughput(dataclasses.replace(final, fusion_threshold=20 * MIB,
                                                                       cycle_time_ms=3.0))
    assert final.cache_enabled  # the switch stage kept the better side
    # warm-up, one sample to apply the first proposal, then SAMPLES_PER_CONFIG per configuration
    assert samples == 2 + 1 + (12 + 2) * SAMPLES_PER_CONFIG
    rows = list(csv.reader(log.open()))
    assert ",".join(rows[0]) == LOG_HEADER
    assert len(rows) == 1 + 12 + 2 + 1  # header, joint stage, cache on/off, the chosen one
    assert rows[1][4:6] == ["5", "4"]  # Horovod's first seed point: 5 ms, 4 MB (the threshold in MB, as Horovod)
    chosen = rows[-1]
    assert chosen[3:6] == ["1", f"{final.cycle_time_ms:g}", f"{final.fusion_threshold / MIB:g}"]
    assert float(chosen[6]) == max(float(r[6]) for r in rows[1:-1] if r[3] == "1")


def test_knobs_the_user_set_are_never_tuned():
    config = AutotuneSettings(enabled=True, warmup_samples=0, steps_per_sample=2, bayes_opt_max_samples=6,
                              fixed=frozenset({"cycle_time_ms", "cache_enabled"}))
    final, history, _ = simulate(config, knobs=("hierarchical_allreduce",))
    assert {k.cycle_time_ms for k in history} == {BAD.cycle_time_ms}
    assert all(k.cache_enabled for k in history)
    assert len({k.fusion_threshold for k in history}) > 3  # the free knob was searched
    assert {k.hierarchical_allreduce for k in history} >= {False, True}  # the transport's switch too
    assert final.cycle_time_ms == BAD.cycle_time_ms


def test_nothing_free_to_tune_finishes_at_once():
    config = AutotuneSettings(enabled=True, warmup_samples=0, steps_per_sample=1,
                              fixed=frozenset({"fusion_threshold", "cycle_time_ms", "cache_enabled"}))
    final, history, samples = simulate(config)
    assert (final, samples) == (BAD, 1)


def test_bayesian_optimizer_finds_the_peak_of_a_noisy_function():
    rng = np.random.default_rng(1)
    opt = BayesianOptimizer([(0.0, 64.0), (1.0, 100.0)], noise=0.1, seed=1)

    def f(x: list[float]) -> float:
        return -((x[0] - 40) / 64) ** 2 - ((x[1] - 20) / 100) ** 2 + rng.normal(0, 0.005)

    for point in ([4, 5], [32, 50], [16, 25], [8, 10]):
        opt.add(point, f(point))
    for _ in range(16):
        point = opt.suggest()
        assert 0 <= point[0] <= 64 and 1 <= point[1] <= 100
        opt.add(point, f(point))
    best = opt.xs[int(np.argmax(opt.ys))] * opt.span + opt.low
    assert abs(best[0] - 40) < 10 and abs(best[1] - 20) < 20, best
