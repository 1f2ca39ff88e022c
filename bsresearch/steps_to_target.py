"""Steps to a target against batch size (Shallue et al. 2019; McCandlish et al. 2018), from sweep tables.

    best = tuned_table(runs)                      # per batch size: best lr, interior?, steps/examples at it
    per_seed = at_best_lr(runs, best)             # every seed's run at its batch size's best lr
    fits = critical_batch_fits(per_seed)          # S = S_min (1 + B_crit/B): all seeds, seed means, each seed
    regime_boundaries(b_crit)                     # where the fitted curve's scaling exponent is 0.8 and 0.2
    local_exponents(best)                         # the measured exponent between neighbouring batch sizes
    noise = noise_checkpoints(noise_runs)         # B_simple / B_noise measured at checkpoints of one run
    value_at_loss(noise, 0.3, "b_simple")         # B_simple where the run crossed the target loss

S is in optimizer steps, E = S x B in examples, B in examples per update; the target is a full-train
loss (mean cross-entropy), read at the evaluation steps, so S has that schedule's resolution.
No torch import: this runs wherever the run directories can be read.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import results
from .config import ConfigError

REGIMES = ("perfect scaling", "diminishing returns", "maximal data parallelism")
# The fitted S = S_min (1 + B_crit/B) has local scaling exponent -dlog S/dlog B = B_crit/(B + B_crit):
# 1 at small B (doubling B halves S), 0 at large B. The regimes are split where it is 0.8 and 0.2, i.e.
# at B_crit/4 and 4 B_crit, symmetric about B_crit on a log axis.
PERFECT_EXPONENT = 0.8
MAXIMAL_EXPONENT = 0.2


# ----------------------------------------------------------------------------- the tuned lr
def tuned_table(runs: pd.DataFrame, steps: str = "steps_to_target", examples: str = "examples_to_target",
                by: str = "batch_size", lr: str = "lr", confidence: float = 0.95) -> pd.DataFrame:
    """Per batch size: the lr with the fewest mean steps over seeds and what was measured at it.

    `runs` is a results.load table of target-budget runs (all states: a run that diverged or hit its
    cap has no steps and counts as the worst, as in results.best_lr). Columns: `by`, lr, interior (the
    best lr lies strictly inside the lrs tried), lr_min, lr_max, n_lrs, n_seeds, n_reached (seeds that
    reached the target at the best lr), then for `steps` and `examples` the mean, std and Student-t
    interval over those seeds (`steps_mean`, `steps_std`, `steps_low`, `steps_high`, ...).
    """
    best = results.best_lr(runs, steps, by=by, lr=lr, minimize=True)
    chosen = at_best_lr(runs, best, by=by, lr=lr)
    stats = results.summarize(chosen, by, [steps, examples], confidence)
    stats = stats.rename(columns=lambda c: c.replace(steps, "steps").replace(examples, "examples"))
    reached = chosen.groupby(by)[steps].apply(lambda s: int(pd.to_numeric(s, errors="coerce").notna().sum()))
    spans = runs.groupby(by)[lr].agg(lr_min="min", lr_max="max")
    table = best.drop(columns=[steps]).merge(spans, on=by).merge(stats.drop(columns=["n"]), on=by)
    table.insert(table.columns.get_loc("n_seeds") + 1, "n_reached", table[by].map(reached).astype(int))
    return table


def at_best_lr(runs: pd.DataFrame, best: pd.DataFrame, by: str = "batch_size", lr: str = "lr") -> pd.DataFrame:
    """The rows of `runs` at their batch size's best lr (one per seed), in batch-size order."""
    keys = best[[by, lr]]
    return runs.merge(keys, on=[by, lr], how="inner").sort_values([by, "seed"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- the critical batch size
def critical_batch_fits(per_seed: pd.DataFrame, steps: str = "steps_to_target", by: str = "batch_size",
                        confidence: float = 0.95) -> pd.DataFrame:
    """S = S_min (1 + B_crit/B) fitted three ways to the runs at the best lr (from at_best_lr):

    - "all seeds": every seed's point (its interval reflects the seed-to-seed scatter and lack of fit);
    - "seed mean": the mean over seeds per batch size;
    - "seed N": each seed alone (their spread is a second, model-free look at the uncertainty).
    One row per fit: fit, n_points, b_crit with its `confidence` interval and standard error, s_min with
    its interval, e_min = S_min B_crit with its standard error, rms_log_residual. Runs that did not reach
    the target are left out (the fit needs finite steps).
    """
    data = per_seed[[by, "seed", steps]].apply(pd.to_numeric, errors="coerce").dropna()
    if data[by].nunique() < 2:
        raise ConfigError(f"a critical batch fit needs steps at 2 or more batch sizes; got {sorted(data[by].unique())}")
    groups = [("all seeds", data), ("seed mean", data.groupby(by, as_index=False)[steps].mean())]
    groups += [(f"seed {int(s)}", g) for s, g in data.groupby("seed")]
    rows = []
    for name, table in groups:
        if table[by].nunique() < 2:
            continue
        fit = results.critical_batch(table, steps=steps, batch=by, confidence=confidence)
        rows.append({"fit": name, "n_points": fit.n_points, "b_crit": fit.b_crit,
                     "b_crit_low": fit.b_crit_interval[0], "b_crit_high": fit.b_crit_interval[1],
                     "b_crit_std_error": fit.b_crit_std_error, "s_min": fit.s_min,
                     "s_min_low": fit.s_min_interval[0], "s_min_high": fit.s_min_interval[1],
                     "e_min": fit.e_min, "e_min_std_error": fit.e_min_std_error,
                     "rms_log_residual": fit.rms_log_residual, "confidence": fit.confidence})
    return pd.DataFrame(rows)


def regime_boundaries(b_crit: float, perfect: float = PERFECT_EXPONENT,
                      maximal: float = MAXIMAL_EXPONENT) -> tuple[float, float]:
    """The batch sizes where the fitted curve's scaling exponent B_crit/(B + B_crit) equals `perfect` and
    `maximal`: below the first, "perfect scaling"; above the second, "maximal data parallelism"."""
    if not 0 < maximal < perfect < 1:
        raise ConfigError(f"regime exponents must satisfy 0 < maximal < perfect < 1; got {maximal}, {perfect}")
    return b_crit * (1 - perfect) / perfect, b_crit * (1 - maximal) / maximal


def regime_of(batch_size: float | Sequence[float], b_crit: float, perfect: float = PERFECT_EXPONENT,
              maximal: float = MAXIMAL_EXPONENT) -> list[str]:
    """The regime (one of REGIMES) of each batch size on the fitted curve."""
    low, high = regime_boundaries(b_crit, perfect, maximal)
    low, high = low * (1 + 1e-9), high * (1 - 1e-9)  # a batch size on a boundary belongs to the outer regime
    sizes = np.atleast_1d(np.asarray(batch_size, dtype=float))
    return [REGIMES[0] if b <= low else REGIMES[2] if b >= high else REGIMES[1] for b in sizes]


def exponent_regime(exponent: float, perfect: float = PERFECT_EXPONENT, maximal: float = MAXIMAL_EXPONENT) -> str:
    """The regime a measured scaling exponent -dlog S/dlog B falls in (the same thresholds as the fit's)."""
    if not math.isfinite(exponent):
        return "unknown"
    return REGIMES[0] if exponent >= perfect else REGIMES[2] if exponent <= maximal else REGIMES[1]


def local_exponents(table: pd.DataFrame, steps: str = "steps_mean", by: str = "batch_size",
                    b_crit: float | None = None) -> pd.DataFrame:
    """The measured scaling exponent -log(S_2/S_1)/log(B_2/B_1) between neighbouring batch sizes of `table`
    (e.g. tuned_table's steps_mean): 1 is perfect scaling, 0 no gain. Columns: b_small, b_large, s_small,
    s_large, exponent, regime (by the measured exponent), and with b_crit the fitted curve's exponent at the
    pair's geometric mean (fitted_exponent) and its regime (fitted_regime)."""
    data = table[[by, steps]].apply(pd.to_numeric, errors="coerce").dropna().sort_values(by)
    b, s = data[by].to_numpy(float), data[steps].to_numpy(float)
    rows = []
    for b1, b2, s1, s2 in zip(b[:-1], b[1:], s[:-1], s[1:]):
        exponent = -math.log(s2 / s1) / math.log(b2 / b1)
        row = {"b_small": b1, "b_large": b2, "s_small": s1, "s_large": s2, "exponent": exponent,
               "regime": exponent_regime(exponent)}
        if b_crit is not None:
            mid = math.sqrt(b1 * b2)
            row["fitted_exponent"] = b_crit / (mid + b_crit)
            row["fitted_regime"] = regime_of(mid, b_crit)[0]
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class LrFit:
    """The tuned lr against batch size fitted by eps(B) = eps_max / (1 + B_lr/B) (McCandlish et al.'s
    eps_opt with B_lr in the place of B_noise), on log eps; intervals at `confidence`."""
    eps_max: float
    b_lr: float                          # examples
    eps_max_interval: tuple[float, float]
    b_lr_interval: tuple[float, float]
    n_points: int
    rms_log_residual: float
    confidence: float

    def predict(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        return self.eps_max / (1 + self.b_lr / np.asarray(batch_size, dtype=float))


def fit_tuned_lr(table: pd.DataFrame, lr: str = "lr", by: str = "batch_size", confidence: float = 0.95) -> LrFit:
    """Fit eps(B) = eps_max/(1 + B_lr/B) to the best lr per batch size (rows with interior == False, whose
    optimum may lie beyond the grid, are left out when the column is there). 1/eps = (1/eps_max)(1 + B_lr/B)
    has the form of S(B), so this is the critical-batch fit applied to 1/eps. The best lrs sit on a factor-2
    grid, so the fit is coarse: read B_lr to within a factor of ~2."""
    from .measure.critical import fit_critical_batch
    data = table[table["interior"].astype(bool)] if "interior" in table else table
    if data[by].nunique() < 2:
        raise ConfigError(f"the tuned-lr fit needs interior best lrs at 2 or more batch sizes; got {len(data)}")
    fit = fit_critical_batch(data[by].to_numpy(float), 1.0 / data[lr].to_numpy(float), confidence)
    return LrFit(eps_max=1 / fit.s_min, b_lr=fit.b_crit,
                 eps_max_interval=(1 / fit.s_min_interval[1], 1 / fit.s_min_interval[0]),
                 b_lr_interval=fit.b_crit_interval, n_points=fit.n_points,
                 rms_log_residual=fit.rms_log_residual, confidence=confidence)


# ----------------------------------------------------------------------------- the noise scale along training
NOISE_COLUMNS = {"noise_b_simple": "b_simple", "noise_b_noise": "b_noise",
                 "noise_b_noise_std_error": "b_noise_std_error", "noise_trace_cov": "trace_cov",
                 "noise_grad_sq_norm": "grad_sq_norm"}


def noise_checkpoints(runs: pd.DataFrame) -> pd.DataFrame:
    """Tidy table of noise-scale measurements taken at the end of fixed-step runs (the `noise_scale`
    measurement: exact B_simple over the training set, B_noise with its Hutchinson standard error).

    Runs of one seed and constant lr that differ only in their step budget follow one trajectory, so
    their ends are checkpoints of it. Columns: batch_size, lr, seed, step, examples, train_loss, test_acc,
    b_simple, b_noise, b_noise_std_error, trace_cov, grad_sq_norm; sorted by seed and step. Runs without
    the measurement (or not ok) are left out.
    """
    ok = results.finished(runs)
    if "noise_b_simple" not in ok:
        return pd.DataFrame(columns=["batch_size", "lr", "seed", "step", "train_loss", *NOISE_COLUMNS.values()])
    ok = ok[ok["noise_b_simple"].notna()]
    keep = ["batch_size", "lr", "seed", "steps", "examples", "train_loss", "test_acc", *NOISE_COLUMNS]
    table = ok[[c for c in keep if c in ok]].rename(columns={"steps": "step", **NOISE_COLUMNS})
    return table.sort_values(["seed", "step"]).reset_index(drop=True)


def value_at_loss(table: pd.DataFrame, target: float, value: str = "b_simple", loss: str = "train_loss",
                  step: str = "step", by: str = "seed") -> pd.DataFrame:
    """Per `by` group (seed): `value` where the run first crossed `loss` <= target, interpolated linearly in
    log(value) against log(loss) between the last checkpoint above the target and the first at or below it.

    Columns: `by`, step_before, step_after, loss_before, loss_after, `value`. NaN when the run never
    crossed (or was already below the target at its first checkpoint: nothing to interpolate from).
    """
    rows = []
    for key, group in table.sort_values(step).groupby(by, sort=True):
        losses, values = group[loss].to_numpy(float), group[value].to_numpy(float)
        below = np.flatnonzero(losses <= target)
        row = {by: key, "step_before": math.nan, "step_after": math.nan, "loss_before": math.nan,
               "loss_after": math.nan, value: math.nan}
        if len(below) and below[0] > 0:
            i, j = below[0] - 1, below[0]
            row.update(step_before=group[step].iloc[i], step_after=group[step].iloc[j],
                       loss_before=losses[i], loss_after=losses[j])
            if losses[i] == losses[j]:
                row[value] = values[j]
            else:
                t = (math.log(target) - math.log(losses[i])) / (math.log(losses[j]) - math.log(losses[i]))
                row[value] = math.exp(math.log(values[i]) + t * (math.log(values[j]) - math.log(values[i])))
        rows.append(row)
    return pd.DataFrame(rows)
