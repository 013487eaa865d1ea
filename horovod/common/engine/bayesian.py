"""Bayesian optimisation of a few continuous knobs, for autotune.

A Gaussian process (scikit-learn's `GaussianProcessRegressor`) models score as a function of the
knobs from the samples so far; the next point is the one with the largest expected improvement
over the best score, found with scipy's L-BFGS-B from random starts. Knobs are scaled to [0, 1]
and scores standardised, so one noise level (HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE) fits any
units. scikit-learn is the optional `autotune` extra.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

# The acquisition search: random candidates scored in one batch, the best few refined with
# L-BFGS-B; and how much improvement counts (exploration vs exploitation).
_CANDIDATES = 2000
_REFINED = 3
_XI = 0.01
# How far (in the [0, 1]-scaled knobs) the score is assumed to stay correlated.
_LENGTH_SCALE = 0.25


def require_scikit_learn() -> None:
    """Fail early, with the fix, where autotune is asked for without its libraries."""
    try:
        import scipy.optimize  # noqa: F401
        import sklearn.gaussian_process  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"HOROVOD_AUTOTUNE=1 needs scikit-learn and scipy ({exc}); install them with "
                          "`pip install khorovod[autotune]`, or turn autotune off") from None


class BayesianOptimizer:
    """Suggests where to sample next within `bounds` ((low, high) per knob), given the scores so far."""

    def __init__(self, bounds: Sequence[tuple[float, float]], noise: float, seed: int = 0) -> None:
        require_scikit_learn()
        self.low = np.array([b[0] for b in bounds], np.float64)
        self.span = np.array([b[1] - b[0] for b in bounds], np.float64)
        self.noise = max(noise, 1e-6)
        self.rng = np.random.default_rng(seed)
        self.xs: list[np.ndarray] = []  # scaled to [0, 1]
        self.ys: list[float] = []

    def add(self, point: Sequence[float], score: float) -> None:
        self.xs.append((np.asarray(point, np.float64) - self.low) / self.span)
        self.ys.append(float(score))

    def _model(self) -> Any:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import Matern

        # Fixed hyperparameters (no marginal-likelihood search): with a handful of noisy samples
        # that search mostly chases noise, and it costs a second per suggestion on a busy host,
        # spent inside one of the engine's cycles. Scores are standardised, knobs scaled to [0, 1].
        gp = GaussianProcessRegressor(kernel=Matern(length_scale=_LENGTH_SCALE, nu=2.5), alpha=self.noise,
                                      normalize_y=True, optimizer=None)
        return gp.fit(np.array(self.xs), np.array(self.ys))

    def suggest(self) -> list[float]:
        """The next point to sample, in the knobs' own units (random while there is nothing to model)."""
        if len(self.xs) < 2:
            return list(self.low + self.rng.random(len(self.low)) * self.span)
        from scipy.optimize import minimize
        from scipy.stats import norm

        gp, best = self._model(), max(self.ys)
        scale = float(np.std(self.ys)) or 1.0

        def expected_improvement(x: np.ndarray) -> np.ndarray:
            mu, sigma = gp.predict(np.atleast_2d(x), return_std=True)
            gain = (mu - best) / scale - _XI
            s = np.maximum(sigma / scale, 1e-9)
            return gain * norm.cdf(gain / s) + s * norm.pdf(gain / s)

        dims = len(self.low)
        candidates = self.rng.random((_CANDIDATES, dims))
        starts = candidates[np.argsort(expected_improvement(candidates))[-_REFINED:]]
        found = [minimize(lambda x: -expected_improvement(x)[0], x0, bounds=[(0.0, 1.0)] * dims, method="L-BFGS-B")
                 for x0 in starts]
        x = min(found, key=lambda result: result.fun).x
        return list(self.low + np.clip(x, 0.0, 1.0) * self.span)
