"""Horovod training as a Ray Tune trainable: a small grid search, each trial a 2-worker Horovod
job in the trial's placement group, rank 0's metrics reported to Tune."""

from __future__ import annotations

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the [ray] extra")
tune = pytest.importorskip("ray.tune", reason="the Ray Tune test needs the [ray] extra")

import horovod.numpy as hvd  # noqa: E402
import horovod.ray  # noqa: E402
from horovod.ray.tune import DistributedTrainableCreator  # noqa: E402


def fit_a_line(config: dict) -> None:
    """Gradient descent on y = 3x, each rank on its own half of the points; averaged gradients."""
    hvd.init()
    x = np.linspace(-1, 1, 8)[hvd.rank()::hvd.size()]
    w = 0.0
    for _ in range(5):
        grad = hvd.allreduce(np.array([np.mean(2 * (w * x - 3 * x) * x)]), op=hvd.Average)[0]
        w -= config["lr"] * grad
        loss = hvd.allreduce(np.array([np.mean((w * x - 3 * x) ** 2)]), op=hvd.Average)[0]
        group = ray.util.get_current_placement_group()
        horovod.ray.report({"loss": float(loss), "workers": hvd.size(), "rank": hvd.rank(),
                            "group": group.id.hex() if group else None})


@pytest.mark.timeout(240)
def test_a_grid_search_of_two_trials(ray_cluster, tmp_path):
    trainable = DistributedTrainableCreator(fit_a_line, num_workers=2, num_cpus_per_worker=1)
    tuner = tune.Tuner(trainable, param_space={"lr": tune.grid_search([0.01, 1.0])},
                       tune_config=tune.TuneConfig(metric="loss", mode="min"),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0))
    grid = tuner.fit()
    assert grid.num_errors == 0
    by_lr = {result.config["lr"]: result.metrics for result in grid}
    assert set(by_lr) == {0.01, 1.0}
    for metrics in by_lr.values():
        assert metrics["training_iteration"] == 5  # every report of rank 0, and only rank 0's
        assert metrics["workers"] == 2 and metrics["rank"] == 0
    # Each trial's workers ran in the placement group Tune reserved for that trial.
    assert None not in {m["group"] for m in by_lr.values()} and by_lr[0.01]["group"] != by_lr[1.0]["group"]
    assert by_lr[1.0]["loss"] < by_lr[0.01]["loss"]
    assert grid.get_best_result().config == {"lr": 1.0}
