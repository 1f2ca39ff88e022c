"""Critical batch size fits (McCandlish et al. 2018): S = S_min (1 + B_crit/B), E = E_min (1 + B/B_crit).

numpy and scipy only (no torch), so results.py and analysis notebooks can use it anywhere.
S is the number of steps and E = S * B the number of examples to reach a fixed target, B_crit = E_min/S_min.
The fit is least squares on log S (steps-to-target data have multiplicative noise and span orders of
magnitude), in the parameters log S_min and log B_crit; uncertainties come from the Jacobian
(covariance = residual variance x (J^T J)^-1) and are reported as standard errors and Student-t
intervals. Because log E = log S + log B, fitting E gives exactly the same parameters as fitting S.

Two definitions of the critical batch size from one fit (`critical_batch_size`):
- "mccandlish": B_crit = E_min / S_min, where the curve bends (McCandlish et al. 2018);
- "excess": the batch at which the steps exceed linear scaling from a reference batch B0 by a fraction x (Zhang et
  al. 2025, x = 0.2): S(B) = (1 + x) S(B0) B0 / B, which on the fitted curve is B = (1 + x) B0 + x B_crit. It rises
  with B_crit at a fixed B0, so its interval is B_crit's mapped through it.
And a power law of a critical batch size against the data seen and/or the model size (`fit_power_law`): least
squares on the logs, with t intervals on the exponents and a prediction interval for a held-out point.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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


DEFINITIONS = ("mccandlish", "excess")


@dataclass(frozen=True)
class CriticalBatch:
    """One critical batch size, its `confidence` interval and how it was defined."""
    definition: str             # "mccandlish" | "excess"
    batch_size: float           # examples
    interval: tuple[float, float]
    confidence: float
    excess: float               # "excess": the fraction above linear scaling (0 for "mccandlish")
    reference_batch: float      # "excess": B0, the batch linear scaling starts from (NaN for "mccandlish")
    fit: CriticalBatchFit


def critical_batch_size(batch_sizes: Sequence[float] | np.ndarray, steps: Sequence[float] | np.ndarray,
                        definition: str = "mccandlish", excess: float = 0.2,
                        reference_batch: float | None = None, confidence: float = 0.95) -> CriticalBatch:
    """The critical batch size of steps-to-target data by either definition (module docstring). `reference_batch`
    (definition "excess") defaults to the smallest batch measured; Zhang et al. 2025 use 256 sequences."""
    if definition not in DEFINITIONS:
        raise ConfigError(f"critical batch size: definition must be one of {', '.join(DEFINITIONS)}; got "
                          f"{definition!r}")
    fit = fit_critical_batch(batch_sizes, steps, confidence)
    if definition == "mccandlish":
        return CriticalBatch(definition, fit.b_crit, fit.b_crit_interval, confidence, 0.0, math.nan, fit)
    if not excess > 0:
        raise ConfigError(f"critical batch size: excess must be a fraction > 0 (0.2 is 20%); got {excess!r}")
    b0 = float(np.min(np.asarray(batch_sizes, dtype=float))) if reference_batch is None else float(reference_batch)
    if not (math.isfinite(b0) and b0 > 0):
        raise ConfigError(f"critical batch size: reference_batch must be a batch size > 0; got {reference_batch!r}")

    def at(b_crit: float) -> float:
        return (1 + excess) * b0 + excess * b_crit

    low, high = fit.b_crit_interval
    return CriticalBatch(definition, at(fit.b_crit), (at(low), at(high)), confidence, excess, b0, fit)


@dataclass(frozen=True)
class PowerLawFit:
    """y = coefficient x prod_k x_k^exponent_k, fitted by least squares on the logs to n_points."""
    coefficient: float
    exponents: dict[str, float]
    exponent_intervals: dict[str, tuple[float, float]]   # `confidence` t intervals (NaN without residual dof)
    residual_std: float         # of log y (NaN without residual dof)
    confidence: float
    n_points: int
    cov: np.ndarray             # covariance of (log coefficient, exponents...) in that order
    features: tuple[str, ...]

    def predict(self, **values: float) -> tuple[float, float, float]:
        """(prediction, low, high) at the features given: the `confidence` prediction interval of a new point
        (the fit's uncertainty and the residual scatter, t with n - p degrees of freedom)."""
        from scipy import stats
        if set(values) != set(self.features):
            raise ConfigError(f"power law: predict needs exactly the features {', '.join(self.features)}; got "
                              f"{', '.join(sorted(values)) or 'none'}")
        row = np.array([1.0] + [math.log(float(values[name])) for name in self.features])
        log_y = math.log(self.coefficient) + sum(self.exponents[n] * row[k + 1] for k, n in enumerate(self.features))
        dof = self.n_points - len(row)
        if dof <= 0:
            return math.exp(log_y), math.nan, math.nan
        se = math.sqrt(float(row @ self.cov @ row) + self.residual_std ** 2)
        t = float(stats.t.ppf((1 + self.confidence) / 2, dof))
        return math.exp(log_y), _exp(log_y - t * se), _exp(log_y + t * se)


def fit_power_law(y: Sequence[float] | np.ndarray, features: Mapping[str, Sequence[float] | np.ndarray],
                  confidence: float = 0.95) -> PowerLawFit:
    """Fit log y = log c + sum_k a_k log x_k (e.g. B_crit against the data seen D and the model size M:
    features={"data": D, "params": M}). Every value must be positive; the features must not be collinear on the
    log scale (Chinchilla-optimal runs have D = 20 M: fit one of them, not both)."""
    from scipy import stats
    target = np.asarray(y, dtype=float)
    names = tuple(features)
    if not names:
        raise ConfigError("power law: give at least one feature (e.g. features={'params': model_sizes})")
    columns = [np.asarray(features[name], dtype=float) for name in names]
    if any(c.shape != target.shape for c in columns) or target.ndim != 1:
        raise ConfigError(f"power law: y and every feature must be lists of the same length; got {target.shape} and "
                          f"{[c.shape for c in columns]}")
    if not all(np.all(np.isfinite(v)) and np.all(v > 0) for v in [target, *columns]):
        raise ConfigError("power law: y and the features must be positive finite numbers")
    x = np.column_stack([np.ones_like(target)] + [np.log(c) for c in columns])
    if len(target) < x.shape[1] or np.linalg.matrix_rank(x) < x.shape[1]:
        raise ConfigError(f"power law: {len(target)} points cannot fit {x.shape[1]} parameters (or the features are "
                          f"collinear on the log scale: {', '.join(names)})")
    coef, *_ = np.linalg.lstsq(x, np.log(target), rcond=None)
    dof = len(target) - x.shape[1]
    residual = np.log(target) - x @ coef
    if dof > 0:
        s2 = float(residual @ residual) / dof
        cov = s2 * np.linalg.inv(x.T @ x)
        t = float(stats.t.ppf((1 + confidence) / 2, dof))
        half = t * np.sqrt(np.diag(cov))
    else:
        s2, cov, half = math.nan, np.full((x.shape[1], x.shape[1]), np.nan), np.full(x.shape[1], np.nan)
    return PowerLawFit(coefficient=math.exp(coef[0]), exponents={n: float(coef[k + 1]) for k, n in enumerate(names)},
                       exponent_intervals={n: (float(coef[k + 1] - half[k + 1]), float(coef[k + 1] + half[k + 1]))
                                           for k, n in enumerate(names)},
                       residual_std=math.sqrt(s2), confidence=confidence, n_points=len(target), cov=cov,
                       features=names)


@dataclass(frozen=True)
class HeldOut:
    """A power law fitted without one point, and that point against the fit's prediction interval."""
    fit: PowerLawFit
    observed: float
    predicted: float
    interval: tuple[float, float]
    inside: bool
    log_error: float            # log(observed / predicted)


def held_out_power_law(y: Sequence[float] | np.ndarray, features: Mapping[str, Sequence[float] | np.ndarray],
                       hold_out: int = -1, confidence: float = 0.95) -> HeldOut:
    """Fit the power law on every point but `hold_out` (by default the last: order the points so that it is the
    largest data or model, an extrapolation) and predict it."""
    target = np.asarray(y, dtype=float)
    index = hold_out % len(target) if len(target) else 0
    keep = np.arange(len(target)) != index
    fit = fit_power_law(target[keep], {n: np.asarray(v, dtype=float)[keep] for n, v in features.items()}, confidence)
    predicted, low, high = fit.predict(**{n: float(np.asarray(v, dtype=float)[index]) for n, v in features.items()})
    observed = float(target[index])
    return HeldOut(fit, observed, predicted, (low, high), bool(low <= observed <= high),
                   math.log(observed / predicted))
