"""Critical batch size fits (McCandlish et al. 2018): S = S_min (1 + B_crit/B), E = E_min (1 + B/B_crit).

numpy and scipy only (no torch), so results.py and analysis notebooks can use it anywhere.
S is the number of steps and E = S * B the number of examples to reach a fixed target, B_crit = E_min/S_min.
The fit is least squares on log S (steps-to-target data have multiplicative noise and span orders of
magnitude), in the parameters log S_min and log B_crit; uncertainties come from the Jacobian
(covariance = residual variance x (J^T J)^-1) and are reported as standard errors and Student-t
intervals. Because log E = log S + log B, fitting E gives exactly the same parameters as fitting S.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..config import ConfigError


@dataclass(frozen=True)
class CriticalBatchFit:
    """S = s_min (1 + b_crit / B), equivalently E = e_min (1 + B / b_crit), fitted to n_points."""
    s_min: float                # fewest steps (infinite batch)
    b_crit: float               # examples
    e_min: float                # fewest examples (batch -> 0) = s_min * b_crit
    s_min_std_error: float      # NaN with only 2 points
    b_crit_std_error: float
    e_min_std_error: float
    s_min_interval: tuple[float, float]   # `confidence` interval (Student t on the log parameters)
    b_crit_interval: tuple[float, float]
    confidence: float
    n_points: int
    rms_log_residual: float     # root mean square of log(S_observed / S_fitted)

    def predict_steps(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        return self.s_min * (1 + self.b_crit / np.asarray(batch_size, dtype=float))

    def predict_examples(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        return self.e_min * (1 + np.asarray(batch_size, dtype=float) / self.b_crit)


def _check(batch_sizes: Sequence[float] | np.ndarray, values: Sequence[float] | np.ndarray,
           name: str) -> tuple[np.ndarray, np.ndarray]:
    b, v = np.asarray(batch_sizes, dtype=float), np.asarray(values, dtype=float)
    if b.shape != v.shape or b.ndim != 1:
        raise ConfigError(f"batch_sizes and {name} must be two lists of the same length; got {b.shape} and {v.shape}")
    if len(np.unique(b)) < 2:
        raise ConfigError(f"a critical batch fit needs at least 2 distinct batch sizes; got {list(b)}")
    if not (np.all(np.isfinite(b)) and np.all(b > 0) and np.all(np.isfinite(v)) and np.all(v > 0)):
        raise ConfigError(f"batch_sizes and {name} must be positive finite numbers (drop runs that never "
                          f"reached the target); got {list(b)} and {list(v)}")
    return b, v


def _exp(x: float) -> float:
    """exp that gives inf (or 0) instead of raising: an interval bound the data cannot constrain."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def fit_critical_batch(batch_sizes: Sequence[float] | np.ndarray, steps: Sequence[float] | np.ndarray,
                       confidence: float = 0.95) -> CriticalBatchFit:
    """Fit S = S_min (1 + B_crit/B) to steps-to-target `steps` measured at `batch_sizes`."""
    from scipy import optimize, stats  # not at the top: it would add ~1 s to every run's start
    b, s = _check(batch_sizes, steps, "steps")
    log_s = np.log(s)

    def residuals(theta: np.ndarray) -> np.ndarray:
        return theta[0] + np.log1p(np.exp(theta[1]) / b) - log_s

    # start from the linear least-squares fit S = a + c/B (a = S_min, c = S_min B_crit)
    a, c = np.linalg.lstsq(np.stack([np.ones_like(b), 1 / b], 1), s, rcond=None)[0]
    a = a if a > 0 else s.min()
    c = c if c > 0 else a * b.min()
    # B_crit is kept within 1e6 of the batch sizes measured: beyond that the data cannot tell it apart
    lo, hi = np.log(b.min()) - math.log(1e6), np.log(b.max()) + math.log(1e6)
    start = np.array([np.log(a), np.clip(np.log(c / a), lo + 1e-9, hi - 1e-9)])
    fit = optimize.least_squares(residuals, start, bounds=([-np.inf, lo], [np.inf, hi]), method="trf")
    log_s_min, log_b_crit = fit.x
    n, dof = len(b), len(b) - 2
    rss = float(np.sum(fit.fun ** 2))
    if dof > 0:
        cov = np.linalg.pinv(fit.jac.T @ fit.jac) * rss / dof
        t = float(stats.t.ppf((1 + confidence) / 2, dof))
    else:  # two points fit exactly: no residuals to estimate the noise from
        cov, t = np.full((2, 2), np.nan), math.nan
    se_log_s, se_log_b = (float(v) for v in np.sqrt(np.maximum(np.diag(cov), 0)))
    se_log_e = float(np.sqrt(np.maximum(cov[0, 0] + cov[1, 1] + 2 * cov[0, 1], 0)))  # log E_min = sum of both
    s_min, b_crit = math.exp(log_s_min), math.exp(log_b_crit)
    return CriticalBatchFit(
        s_min=s_min, b_crit=b_crit, e_min=s_min * b_crit,
        s_min_std_error=s_min * se_log_s, b_crit_std_error=b_crit * se_log_b,
        e_min_std_error=s_min * b_crit * se_log_e,
        s_min_interval=(_exp(log_s_min - t * se_log_s), _exp(log_s_min + t * se_log_s)),
        b_crit_interval=(_exp(log_b_crit - t * se_log_b), _exp(log_b_crit + t * se_log_b)),
        confidence=confidence, n_points=n, rms_log_residual=math.sqrt(rss / n))


def fit_critical_batch_examples(batch_sizes: Sequence[float] | np.ndarray, examples: Sequence[float] | np.ndarray,
                                confidence: float = 0.95) -> CriticalBatchFit:
    """Fit E = E_min (1 + B/B_crit) to examples-to-target; the same fit as on steps S = E/B."""
    b, e = _check(batch_sizes, examples, "examples")
    return fit_critical_batch(b, e / b, confidence)
