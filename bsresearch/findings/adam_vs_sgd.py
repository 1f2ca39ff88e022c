"""The critical batch size of Adam against SGD with momentum (Zhang et al. 2019; Nado et al. 2021), from
sweep tables of steps-to-target runs. No torch import.

    best = tuned_by_optimizer(runs[runs["seed"].isin([1, 2])])    # per optimizer and B: the best lr
    print(seeds_overrides(best))                                  # the second stage's lr per (optimizer, B)
    points = points_by_optimizer(runs, best)                       # every seed at the best lr, + in_fit
    test = compare_critical_batches(points, best)                  # rho = B_crit(Adam)/B_crit(SGD), verdict
    figures.steps_by_optimizer(ax, points, test)

The per-batch-size machinery (the best lr, the runs at it, the fit S = S_min (1 + B_crit/B)) is that of
findings/steps_to_target.py, applied to each optimizer's runs. S is in optimizer steps, B in examples per
update. Setting and pre-registered test: docs/protocols.md#adam-vs-sgd.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.adam_vs_sgd (`figures` above).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pandas as pd
from scipy import stats as scipy_stats

from .. import results
from ..config import ConfigError
from ..measure.critical import CriticalBatchFit
from .steps_to_target import at_best_lr, tuned_table
from .verdict import PreregisteredTest, Verdict

OPTIMIZER = "optimizer"
STEPS = "steps_to_target"


def _check_columns(runs: pd.DataFrame, columns: tuple[str, ...], where: str) -> None:
    for column in columns:
        if column not in runs:
            raise ConfigError(f"{where}: the runs table has no column {column!r}")


def tuned_by_optimizer(runs: pd.DataFrame, optimizer: str = OPTIMIZER, confidence: float = 0.95) -> pd.DataFrame:
    """steps_to_target.tuned_table for each optimizer's runs (give it the selection seeds only), stacked,
    with the optimizer as first column: per (optimizer, batch size) the lr with the fewest mean steps, its
    `interior` flag, and the steps and examples at it."""
    _check_columns(runs, (optimizer, "batch_size", "lr", "seed", STEPS), "tuned_by_optimizer")
    tables = [tuned_table(group, confidence=confidence).assign(**{optimizer: name})
              for name, group in runs.groupby(optimizer, sort=True)]
    table = pd.concat(tables, ignore_index=True)
    return table[[optimizer, *[c for c in table.columns if c != optimizer]]]


def seeds_overrides(best: pd.DataFrame, optimizer: str = OPTIMIZER) -> str:
    """The `overrides:` lines of the second-stage spec (adam_vs_sgd_seeds.yaml): the best lr of every
    (optimizer, batch size), one line each, exactly as chosen (repr keeps every digit)."""
    lines = ["overrides:"]
    for _, row in best.sort_values([optimizer, "batch_size"]).iterrows():
        lines.append(f"  - {{where: {{{optimizer}: {row[optimizer]}, batch_size: {int(row['batch_size'])}}}, "
                     f"set: {{lr: {float(row['lr'])!r}}}}}")
    return "\n".join(lines)


def points_by_optimizer(runs: pd.DataFrame, best: pd.DataFrame, optimizer: str = OPTIMIZER,
                        min_reached: int = 3) -> pd.DataFrame:
    """Every run (all seeds: selection and second stage) at its (optimizer, batch size)'s best lr, with
    `reached` (a finite, positive steps_to_target) and `in_fit`: reached, and at least `min_reached` seeds of
    that batch size reached the target (else the batch size is left out of the optimizer's fit). Unlike
    steps_to_target.fit_points, which returns only the points in the fit, every run stays, flagged (the
    figure draws the ones left out)."""
    _check_columns(runs, (optimizer, "batch_size", "lr", "seed", STEPS), "points_by_optimizer")
    parts = []
    for name, group in best.groupby(optimizer, sort=True):
        chosen = at_best_lr(runs[runs[optimizer] == name], group)
        steps = pd.to_numeric(chosen[STEPS], errors="coerce")
        chosen = chosen.assign(reached=steps.notna() & (steps > 0))
        n_reached = chosen.groupby("batch_size")["reached"].transform("sum")
        parts.append(chosen.assign(n_reached=n_reached, in_fit=chosen["reached"] & (n_reached >= min_reached)))
    return pd.concat(parts, ignore_index=True)


def fittable(points: pd.DataFrame, optimizer: str = OPTIMIZER) -> list[str]:
    """The optimizers with points in the fit at 2 or more batch sizes (optimizer_fit needs that)."""
    return [str(name) for name, group in points.groupby(optimizer, sort=True)
            if group.loc[group["in_fit"].astype(bool), "batch_size"].nunique() >= 2]


def optimizer_fit(points: pd.DataFrame, name: str, optimizer: str = OPTIMIZER,
                  confidence: float = 0.95) -> CriticalBatchFit:
    """S = S_min (1 + B_crit/B) on every (batch size, seed) point of one optimizer that is in the fit."""
    data = points[(points[optimizer] == name) & points["in_fit"].astype(bool)]
    if data["batch_size"].nunique() < 2:
        raise ConfigError(f"optimizer {name!r}: a critical batch fit needs points at 2 or more batch sizes; "
                          f"got {sorted(data['batch_size'].unique())}")
    return results.critical_batch(data, steps=STEPS, confidence=confidence)


@dataclass(frozen=True)
class CriticalBatchRatio(PreregisteredTest):
    """rho = B_crit(a) / B_crit(b) with its interval on the log scale, and the pre-registered verdict."""
    ratio: float
    low: float
    high: float
    dof: float                                # Welch-Satterthwaite, from the two fits' n - 2
    b_crit_a: float
    b_crit_a_interval: tuple[float, float]
    b_crit_b: float
    b_crit_b_interval: tuple[float, float]
    intervals_overlap: bool
    factor: float                             # the ratio the verdict asks for (2)
    verdict: Verdict
    within_factor: bool                       # rho's interval lies within [1/factor, factor] (Nado's reading)
    problems: tuple[str, ...] = ()            # why not testable


def critical_batch_ratio(fit_a: CriticalBatchFit, fit_b: CriticalBatchFit, factor: float = 2.0,
                         confidence: float = 0.95) -> CriticalBatchRatio:
    """rho = B_crit(a)/B_crit(b): log rho +- t(nu) sqrt(se_a^2 + se_b^2), se the standard errors of
    log B_crit of the two (independent) fits, nu = (se_a^2 + se_b^2)^2 / (se_a^4/(n_a-2) + se_b^4/(n_b-2)).
    Verdict: reproduced when rho >= factor and the B_crit intervals do not overlap (a's above b's);
    partly when rho's interval lies above 1 otherwise; not reproduced when it reaches 1 or below."""
    se_a, se_b = fit_a.b_crit_std_error / fit_a.b_crit, fit_b.b_crit_std_error / fit_b.b_crit
    dof_a, dof_b = fit_a.n_points - 2, fit_b.n_points - 2
    ratio = fit_a.b_crit / fit_b.b_crit
    var = se_a ** 2 + se_b ** 2
    if dof_a > 0 and dof_b > 0 and math.isfinite(var):
        dof = var ** 2 / (se_a ** 4 / dof_a + se_b ** 4 / dof_b) if var > 0 else float(dof_a + dof_b)
        half = float(scipy_stats.t.ppf((1 + confidence) / 2, dof)) * math.sqrt(var)
        low, high = ratio * math.exp(-half), ratio * math.exp(half)
    else:
        dof, low, high = math.nan, math.nan, math.nan
    overlap = not fit_a.b_crit_interval[0] > fit_b.b_crit_interval[1]
    if not math.isfinite(low):
        verdict = Verdict.NOT_TESTABLE
    elif ratio >= factor and not overlap:
        verdict = Verdict.REPRODUCED
    elif low > 1:
        verdict = Verdict.PARTLY
    else:
        verdict = Verdict.NOT_REPRODUCED
    within = math.isfinite(low) and 1 / factor <= low and high <= factor
    return CriticalBatchRatio(ratio, low, high, dof, fit_a.b_crit, fit_a.b_crit_interval, fit_b.b_crit,
                              fit_b.b_crit_interval, overlap, factor, verdict, within)


def validity_problems(best: pd.DataFrame, points: pd.DataFrame, optimizer: str = OPTIMIZER,
                      min_batch_sizes: int = 4) -> list[str]:
    """The pre-registered validity checks, one line per failure: a best lr on its grid's edge, a fit with
    fewer than `min_batch_sizes` batch sizes, a run at a best lr that failed, timed out or died."""
    problems = [f"{row[optimizer]} B={int(row['batch_size'])}: best lr {row['lr']:g} is on the edge of the lrs "
                f"tried [{row['lr_min']:g}, {row['lr_max']:g}]" for _, row in best.iterrows() if not row["interior"]]
    for name, group in points.groupby(optimizer, sort=True):
        sizes = group.loc[group["in_fit"].astype(bool), "batch_size"].nunique()
        if sizes < min_batch_sizes:
            problems.append(f"{name}: {sizes} batch sizes in the fit, fewer than {min_batch_sizes}")
    if "state" in points:
        bad = points[~points["state"].isin(["ok", "diverged"])]
        problems += [f"{r[optimizer]} B={int(r['batch_size'])} seed {int(r['seed'])}: run {r['state']} (rerun it)"
                     for _, r in bad.iterrows()]
    return problems


def compare_critical_batches(points: pd.DataFrame, best: pd.DataFrame, a: str = "adam", b: str = "sgd",
                             optimizer: str = OPTIMIZER, factor: float = 2.0,
                             confidence: float = 0.95) -> CriticalBatchRatio:
    """The pre-registered test: the two fits, their ratio and verdict; "not testable" (with the reasons in
    `problems`, and NaN numbers when a fit cannot be made, e.g. before the second stage has run) when a
    validity check fails."""
    problems = validity_problems(best, points, optimizer)
    try:
        ratio = critical_batch_ratio(optimizer_fit(points, a, optimizer, confidence),
                                     optimizer_fit(points, b, optimizer, confidence), factor, confidence)
    except ConfigError as error:
        nan = (math.nan, math.nan)
        return CriticalBatchRatio(math.nan, math.nan, math.nan, math.nan, math.nan, nan, math.nan, nan, True,
                                  factor, Verdict.NOT_TESTABLE, False, tuple(problems) or (str(error),))
    if problems:
        return dataclasses.replace(ratio, verdict=Verdict.NOT_TESTABLE, problems=tuple(problems))
    return ratio
