"""Where a metric peaks along a grid, with bootstrap intervals over seeds, and how that peak scales.

Smith & Le (2018): SGD's noise scale is g = lr N / (B (1 - m)), so at a fixed number of epochs the test
accuracy peaks at a batch size B_opt proportional to lr N. Jastrzebski et al. (2017): runs with the same
lr / B follow the same dynamics (per epoch) until the learning rate gets too large. This module turns a
results table (bsresearch.results.load) into those numbers:

    sgd_noise_scale(lr, n, b, momentum)             # g = lr N / (B (1 - m))
    opt = optimum_by_group(runs, "test_acc", x="batch_size", by="lr")   # B_opt per lr, bootstrap interval
    fit = power_law(opt)                            # slope of log B_opt vs log lr (predicted: 1), interval
    seeds = power_law_by_seed(runs, "test_acc", by="lr")   # the slope per seed, t interval: the primary test
    seeds.verdict                                   # slope_verdict(low, high): docs/protocols.md#smith-le
    agreement(runs, "test_acc", by="batch_size")    # along lr/B = const: each B against the smallest B
    curve_gaps(history, "test_acc", reference=16)   # how far each B's mean learning curve is from the reference
    agree, gaps, breaks = diagonals(runs, history)  # both, per equal-lr/B diagonal, and where each breaks
    matched_loss_test(target_runs, "test_acc", by="lr")   # v4: B_opt among runs trained to a common train loss
    argmax_argmin(runs, "test_acc", "train_loss")   # v4: is the fixed-budget optimum where the train loss is lowest?

The peak along a grid is the vertex of the parabola through the best grid point and its two neighbours,
in log2(x) (a batch-size grid is geometric); at an edge of the grid the peak is not resolved, and the edge
value is returned with interior=False. Intervals come from a bootstrap over seeds: each grid cell's seeds
are resampled independently. That ignores that runs sharing a seed share their initial weights (which
tends to widen the interval), while with few seeds a percentile bootstrap is too narrow: the
pre-registered test uses power_law_by_seed's t interval over per-seed slopes; the bootstrap interval
is secondary. No torch import.
Setting and pre-registered test: docs/protocols.md#smith-le.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.smith_le.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..config import ConfigError
from ..stats import lower_is_better, welch_interval
from .verdict import PreregisteredTest, Verdict


def sgd_noise_scale(lr: float | np.ndarray, train_size: float | np.ndarray, batch_size: float | np.ndarray,
                momentum: float | np.ndarray = 0.0) -> float | np.ndarray:
    """Smith & Le's SGD noise scale g = lr N / (B (1 - m)) (their eps N / B, with momentum's 1/(1 - m)).

    lr is the rate actually used (after any batch-size scaling); N the training-set size; B the batch size.
    The paper's exact form is lr (N/B - 1) / (1 - m); the -1 is dropped, as in their predictions.
    """
    return np.asarray(lr) * np.asarray(train_size) / (np.asarray(batch_size) * (1.0 - np.asarray(momentum)))


@dataclass(frozen=True)
class Peak:
    """The best point of a curve y(x) sampled on a grid."""
    x_best: float    # the grid value with the best y
    x_peak: float    # vertex of the parabola in log2(x) through the best point and its neighbours (x units)
    y_best: float    # y at x_best
    interior: bool   # x_best has a neighbour on each side; if not, x_peak = x_best and the peak is unresolved


def parabola_peak(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, maximize: bool = True) -> Peak:
    """The peak of y(x) on the grid x (positive, any order; NaN y values are left out).

    The vertex of the parabola through the best point and its two neighbours, fitted in log2(x), lies
    between those neighbours (the middle point is the best of the three); a flat triple returns x_best.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    keep = np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) == 0:
        raise ValueError("parabola_peak needs at least one finite y value")
    if np.any(x <= 0):
        raise ValueError(f"parabola_peak fits in log2(x): x must be positive; got {x.tolist()}")
    order = np.argsort(x)
    u, v = np.log2(x[order]), (y[order] if maximize else -y[order])
    k = int(np.argmax(v))
    y_best = float(y[order][k])
    if k == 0 or k == len(u) - 1:
        return Peak(float(2 ** u[k]), float(2 ** u[k]), y_best, False)
    (u0, u1, u2), (v0, v1, v2) = u[k - 1:k + 2], v[k - 1:k + 2]
    denominator = (u1 - u0) * (v1 - v2) - (u1 - u2) * (v1 - v0)
    if denominator == 0:
        return Peak(float(2 ** u1), float(2 ** u1), y_best, True)
    vertex = u1 - 0.5 * ((u1 - u0) ** 2 * (v1 - v2) - (u1 - u2) ** 2 * (v1 - v0)) / denominator
    return Peak(float(2 ** u1), float(2 ** vertex), y_best, True)


@dataclass(frozen=True)
class Optimum:
    """The peak of `metric` along `x` for each value of `by`, with bootstrap replicates over seeds.

    table: one row per group: `by`, x_best, x_opt (parabola vertex of the seed-mean curve), x_opt_low and
    x_opt_high (percentile interval of the replicates), interior (x_best inside the grid), interior_share
    (share of replicates whose best point is inside the grid), y_best (the best seed mean), n_grid (grid
    points with data), min_seeds (fewest seeds in a cell).
    replicates: array (n_boot, n_groups) of the replicates' x_opt, columns in the order of table rows.
    """
    metric: str
    x: str
    by: str
    confidence: float
    table: pd.DataFrame
    replicates: np.ndarray

    def describe(self, label: str | None = None) -> str:
        """One line: '<label> <group>: x_opt [low, high]' per group, '(edge)' where the peak is not resolved."""
        label = self.by if label is None else label
        return "; ".join(f"{label} {_group_label(r[self.by])}: {r['x_opt']:.0f} [{r['x_opt_low']:.0f}, "
                         f"{r['x_opt_high']:.0f}]" + ("" if r["interior"] else " (edge)")
                         for _, r in self.table.iterrows())


def _cells(group: pd.DataFrame, metric: str, x: str) -> tuple[np.ndarray, list[np.ndarray]]:
    values = group.assign(_y=pd.to_numeric(group[metric], errors="coerce")).dropna(subset=["_y"])
    grid = np.array(sorted(values[x].unique()), float)
    return grid, [values.loc[values[x] == g, "_y"].to_numpy(float) for g in grid]


def optimum_by_group(runs: pd.DataFrame, metric: str = "test_acc", x: str = "batch_size", by: str = "lr",
                     n_boot: int = 2000, seed: int = 0, confidence: float = 0.95,
                     maximize: bool | None = None) -> Optimum:
    """For each value of `by` (e.g. the lr), where the seed-mean of `metric` peaks along `x` (batch size).

    `runs` has one row per run (bsresearch.results.load; include diverged runs to count them with the
    accuracy they ended at). Runs whose metric is missing are left out. The interval resamples each grid
    cell's seeds with replacement (numpy generator seeded with `seed`), n_boot times.
    """
    for column in (metric, x, by):
        if column not in runs:
            raise ConfigError(f"optimum_by_group: no column {column!r} in the runs table")
    maximize = not lower_is_better(metric) if maximize is None else maximize
    rng = np.random.default_rng(seed)
    rows, replicates = [], []
    for key, group in runs.groupby(by, sort=True):
        grid, cells = _cells(group, metric, x)
        if len(grid) == 0:
            continue
        peak = parabola_peak(grid, [c.mean() for c in cells], maximize)
        # n_boot resampled seed-means per cell: (n_boot, n_grid)
        means = np.stack([c[rng.integers(0, len(c), size=(n_boot, len(c)))].mean(axis=1) for c in cells], axis=1)
        peaks = [parabola_peak(grid, m, maximize) for m in means]
        boot = np.array([p.x_peak for p in peaks])
        tail = (1 - confidence) / 2
        low, high = np.quantile(np.log2(boot), [tail, 1 - tail])
        rows.append({by: key, "x_best": peak.x_best, "x_opt": peak.x_peak, "x_opt_low": float(2 ** low),
                     "x_opt_high": float(2 ** high), "interior": peak.interior,
                     "interior_share": float(np.mean([p.interior for p in peaks])), "y_best": peak.y_best,
                     "n_grid": len(grid), "min_seeds": min(len(c) for c in cells)})
        replicates.append(boot)
    table = pd.DataFrame(rows)
    reps = np.stack(replicates, axis=1) if replicates else np.empty((n_boot, 0))
    return Optimum(metric, x, by, confidence, table, reps)


@dataclass(frozen=True)
class PowerLaw:
    """x_opt = a * group^slope, fitted by least squares in log-log space on the groups' point estimates."""
    slope: float
    slope_low: float        # percentile interval of the slope over the bootstrap replicates
    slope_high: float
    prefactor: float        # a
    groups: tuple[float, ...]  # the group values used (interior peaks only, unless asked otherwise)
    confidence: float
    n_excluded: int         # groups left out because their peak lies at an edge of the grid

    def predict(self, group: float | np.ndarray) -> float | np.ndarray:
        return self.prefactor * np.asarray(group, float) ** self.slope

    def covers(self, slope: float) -> bool:
        """Whether `slope` (e.g. the predicted 1) lies inside the interval (to rounding)."""
        tolerance = 1e-9 * max(1.0, abs(slope))
        return self.slope_low - tolerance <= slope <= self.slope_high + tolerance


def _log_slope(u: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    slope, intercept = np.polyfit(u, v, 1)
    return float(slope), float(intercept)


def power_law(optimum: Optimum, interior_only: bool = True) -> PowerLaw:
    """Fit x_opt proportional to group^slope across the groups of `optimum` (e.g. B_opt vs lr).

    The point estimate is the least-squares line through (log group, log x_opt); the interval is the
    percentile interval of the same fit to each bootstrap replicate. Groups whose peak is at an edge of
    the grid are censored (the true peak lies beyond it) and left out when interior_only.
    """
    table = optimum.table
    use = table["interior"].to_numpy(bool) if interior_only else np.ones(len(table), bool)
    groups = table[optimum.by].to_numpy(float)[use]
    if len(groups) < 2 or len(np.unique(groups)) < 2:
        return PowerLaw(math.nan, math.nan, math.nan, math.nan, tuple(groups), optimum.confidence,
                        int((~use).sum()))
    u = np.log(groups)
    slope, intercept = _log_slope(u, np.log(table["x_opt"].to_numpy(float)[use]))
    boot = np.array([_log_slope(u, np.log(r))[0] for r in optimum.replicates[:, use]])
    tail = (1 - optimum.confidence) / 2
    low, high = np.quantile(boot, [tail, 1 - tail])
    return PowerLaw(slope, float(low), float(high), float(math.exp(intercept)), tuple(groups.tolist()),
                    optimum.confidence, int((~use).sum()))


@dataclass(frozen=True)
class SeedSlopes:
    """The power-law slope fitted to each seed's own peaks, and the Student-t interval of their mean.

    The pre-registered statistic (docs/protocols.md#smith-le): with few seeds a percentile bootstrap
    interval is too narrow, while the t interval over per-seed slopes (n - 1 degrees of freedom) is not,
    at the price of noisier peaks.
    """
    slopes: tuple[float, ...]   # one per seed (seeds with fewer than 2 interior peaks are left out)
    mean: float
    low: float
    high: float
    confidence: float
    n_censored: int             # (seed, group) peaks at an edge of the grid, left out of their seed's fit

    def covers(self, slope: float) -> bool:
        return self.low <= slope <= self.high

    @property
    def verdict(self) -> Verdict:
        """The pre-registered verdict on this t interval (slope_verdict)."""
        return slope_verdict(self.low, self.high)

    @property
    def extend_seeds(self) -> bool:
        """docs/protocols.md, statistics item 3, as experiments/smith_le.yaml states it: with fewer than 8
        seeds, an interval that contains either threshold, 0 (reproduced/partly against not reproduced)
        or the predicted slope 1 (reproduced against partly), extends the sweeps once, to 8 seeds."""
        return len(self.slopes) < 8 and (self.low <= 0 <= self.high or self.low <= 1 <= self.high)


def slope_verdict(low: float, high: float, predicted: float = 1.0) -> Verdict:
    """docs/protocols.md#smith-le: reproduced when the slope's interval contains `predicted` (1) and its
    lower end is above 0; partly when the lower end is above 0 and the interval excludes 1; not reproduced
    when the lower end is at or below 0; not testable when there is no interval (fewer than 2 seeds with
    resolved peaks at 2 or more groups)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return Verdict.NOT_TESTABLE
    if low <= 0:
        return Verdict.NOT_REPRODUCED
    return Verdict.REPRODUCED if low <= predicted <= high else Verdict.PARTLY


def power_law_by_seed(runs: pd.DataFrame, metric: str = "test_acc", x: str = "batch_size", by: str = "lr",
                      seed: str = "seed", confidence: float = 0.95, maximize: bool | None = None) -> SeedSlopes:
    """For each seed: the peak of its own `metric`-vs-`x` curve in every `by` group (parabola_peak), and
    the least-squares slope of log peak against log group; then the mean slope and its t interval."""
    from scipy import stats
    maximize = not lower_is_better(metric) if maximize is None else maximize
    slopes, censored = [], 0
    for _, runs_s in runs.groupby(seed, sort=True):
        groups, peaks = [], []
        for key, group in runs_s.groupby(by, sort=True):
            values = pd.to_numeric(group[metric], errors="coerce")
            if values.notna().sum() == 0:
                continue
            peak = parabola_peak(group[x].to_numpy(float), values.to_numpy(float), maximize)
            if not peak.interior:
                censored += 1
                continue
            groups.append(float(key))
            peaks.append(peak.x_peak)
        if len(set(groups)) >= 2:
            slopes.append(_log_slope(np.log(groups), np.log(peaks))[0])
    values = np.array(slopes)
    mean = float(values.mean()) if len(values) else math.nan
    half = float(stats.t.ppf((1 + confidence) / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))) \
        if len(values) > 1 else math.nan
    return SeedSlopes(tuple(slopes), mean, mean - half, mean + half, confidence, censored)


def agreement(runs: pd.DataFrame, metric: str = "test_acc", by: str = "batch_size", reference: float | None = None,
              confidence: float = 0.95) -> pd.DataFrame:
    """Each group's final `metric` against the reference group's (default: the smallest `by` value).

    One row per group: `by`, n (runs), n_diverged (state "diverged", when a state column is present),
    mean, std, diff (mean - reference mean), diff_low and diff_high (Welch's t interval of the difference;
    NaN with fewer than 2 runs on either side), and agrees: no run diverged and the interval contains 0.
    Runs with a missing metric count in n and n_diverged but not in the statistics.
    """
    groups = sorted(runs[by].unique())
    if not groups:
        return pd.DataFrame(columns=[by, "n", "n_diverged", "mean", "std", "diff", "diff_low", "diff_high", "agrees"])
    reference = groups[0] if reference is None else reference
    values = {g: pd.to_numeric(runs.loc[runs[by] == g, metric], errors="coerce").dropna().to_numpy(float)
              for g in groups}
    if reference not in values:
        raise ConfigError(f"agreement: reference {by}={reference} is not among the runs ({groups})")
    ref = values[reference]
    rows = []
    for g in groups:
        a = values[g]
        diverged = int((runs.loc[runs[by] == g, "state"] == "diverged").sum()) if "state" in runs else 0
        d = welch_interval(a, ref, confidence)
        diff, low, high = d.diff, d.low, d.high
        agrees = diverged == 0 and (math.isnan(low) or low <= 0 <= high)
        rows.append({by: g, "n": int((runs[by] == g).sum()), "n_diverged": diverged,
                     "mean": float(a.mean()) if len(a) else math.nan,
                     "std": float(a.std(ddof=1)) if len(a) > 1 else math.nan,
                     "diff": diff, "diff_low": low, "diff_high": high, "agrees": bool(agrees)})
    return pd.DataFrame(rows)


def breaking_point(table: pd.DataFrame, by: str = "batch_size") -> float | None:
    """The smallest `by` value of an `agreement` table that does not agree with the reference (None if all do)."""
    broken = table.loc[~table["agrees"].astype(bool), by]
    return float(broken.min()) if len(broken) else None


def curve_gaps(history: pd.DataFrame, y: str = "test_acc", by: str = "batch_size", x: str = "epoch",
               reference: float | None = None, points: int = 30, x_min: float | None = None) -> pd.DataFrame:
    """How far each group's mean learning curve lies from the reference group's, on a common x grid.

    Each run's y(x) is interpolated linearly in log(x) onto `points` log-spaced values from x_min (default:
    the largest first positive x of any run) to the smallest last x of any run; the seed-mean curves are then
    compared. One row per group: `by`, max_gap and mean_gap (largest and mean |mean - reference mean| over
    the grid), seed_spread (mean over the grid of the group's std across seeds: the noise to compare with).
    """
    data = history[history[x] > 0]
    starts = data.groupby("run_id")[x].min()
    ends = data.groupby("run_id")[x].max()
    lo = float(starts.max()) if x_min is None else x_min
    hi = float(ends.min())
    if not hi > lo:
        raise ConfigError(f"curve_gaps: the runs' {x} ranges do not overlap ({lo:g} to {hi:g})")
    grid = np.geomspace(lo, hi, points)
    curves: dict[float, list[np.ndarray]] = {}
    for _, run in data.groupby("run_id", sort=False):
        run = run.sort_values(x)
        curves.setdefault(run[by].iloc[0], []).append(np.interp(np.log(grid), np.log(run[x].to_numpy(float)),
                                                                run[y].to_numpy(float)))
    groups = sorted(curves)
    reference = groups[0] if reference is None else reference
    if reference not in curves:
        raise ConfigError(f"curve_gaps: reference {by}={reference} is not among the runs ({groups})")
    ref = np.mean(curves[reference], axis=0)
    rows = []
    for g in groups:
        stack = np.stack(curves[g])
        gap = np.abs(stack.mean(axis=0) - ref)
        spread = float(stack.std(axis=0, ddof=1).mean()) if len(stack) > 1 else math.nan
        rows.append({by: g, "max_gap": float(gap.max()), "mean_gap": float(gap.mean()), "seed_spread": spread,
                     "n": len(stack)})
    return pd.DataFrame(rows)


def diagonals(runs: pd.DataFrame, history: pd.DataFrame, metric: str = "test_acc", confidence: float = 0.95
              ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, tuple[float, float | None, float | None, float | None]]]:
    """Jastrzebski et al.'s equal-lr/B diagonals, one per `variant` of `runs`: where each stops agreeing.

    runs: a results table with variant, batch_size, effective_lr, state and a boolean `collapsed` column;
    history: results.load_history of those runs (with variant). Returns (agree, gaps, breaks): `agreement`
    of every batch size with the smallest, per diagonal (plus lr_over_b, effective_lr, n_collapsed);
    `curve_gaps` of the finished runs' `metric` and log10 train loss curves against epochs; and per variant
    (lr/B, the breaking batch size, the lr there, the smallest batch size with a run collapsed to chance),
    None where there is none.
    """
    history = history.assign(log10_train_loss=np.log10(history["train_loss"].clip(lower=1e-8)))
    ok_ids = set(runs.loc[runs["state"] == "ok", "run_id"])
    agree_tables, gap_tables = [], []
    breaks: dict[str, tuple[float, float | None, float | None, float | None]] = {}
    for variant in sorted(runs["variant"].unique()):
        runs_v = runs[runs["variant"] == variant]
        ratio = float((runs_v["effective_lr"] / runs_v["batch_size"]).iloc[0])
        collapsed = runs_v.groupby("batch_size")["collapsed"].sum()
        table = agreement(runs_v, metric, by="batch_size", confidence=confidence)
        table = table.assign(variant=variant, lr_over_b=ratio, effective_lr=table["batch_size"] * ratio,
                             n_collapsed=table["batch_size"].map(collapsed).astype(int))
        agree_tables.append(table)
        hist_ok = history[(history["variant"] == variant) & history["run_id"].isin(ok_ids)]
        for y in (metric, "log10_train_loss"):
            gap_tables.append(curve_gaps(hist_ok, y, by="batch_size", x="epoch").assign(variant=variant, curve=y))
        b_break = breaking_point(table)
        sizes_collapsed = table.loc[table["n_collapsed"] > 0, "batch_size"]
        breaks[variant] = (ratio, b_break, None if b_break is None else b_break * ratio,
                           float(sizes_collapsed.min()) if len(sizes_collapsed) else None)
    return pd.concat(agree_tables, ignore_index=True), pd.concat(gap_tables, ignore_index=True), breaks


# ----------------------------------------------------------------------------- at matched train loss (protocol v4)
MIN_REACHED = 3   # a (group, x) cell enters the matched-loss curve when this many of its seeds reached the target
MIN_PEAKED = 3    # groups whose matched-loss curve peaks inside the trainable range, needed for "reproduced"


def reached_cells(runs: pd.DataFrame, x: str = "batch_size", by: str = "lr", reached: str = "reached",
                  min_reached: int = MIN_REACHED) -> pd.DataFrame:
    """Per (`by`, `x`) cell of runs trained to a target train loss: n (runs), n_reached (runs whose boolean
    `reached` column is true: they stopped at the target, not diverged or capped) and included (n_reached >=
    min_reached: the cell is trainable to the target and enters the matched-loss curve)."""
    for column in (x, by, reached):
        if column not in runs:
            raise ConfigError(f"reached_cells: no column {column!r} in the runs table")
    flags = runs[reached].fillna(False).astype(bool)
    cells = (runs.assign(_reached=flags).groupby([by, x], sort=True)
             .agg(n=("_reached", "size"), n_reached=("_reached", "sum")).reset_index())
    cells["n_reached"] = cells["n_reached"].astype(int)
    cells["included"] = cells["n_reached"] >= min_reached
    return cells


def _included_runs(runs: pd.DataFrame, x: str, by: str, reached: str, min_reached: int) -> pd.DataFrame:
    """The runs that reached the target, in cells that are included (reached_cells)."""
    cells = reached_cells(runs, x, by, reached, min_reached)
    keep = cells[cells["included"]][[by, x]]
    flags = runs[reached].fillna(False).astype(bool)
    return runs[flags].merge(keep, on=[by, x], how="inner")


def _held_out_best(group: pd.DataFrame, x: str, seed: str, maximize: bool) -> list[float]:
    """Each seed's value (column _y) at the cell that is best on the other seeds' mean: the best cell chosen and
    judged on the same seeds would be biased towards beating the others. A seed without a value at that cell
    (it did not reach the target there) contributes nothing."""
    out: list[float] = []
    for s in sorted(group[seed].unique()):
        means = group[group[seed] != s].groupby(x)["_y"].mean().dropna()
        if not len(means):
            continue
        cell = means.idxmax() if maximize else means.idxmin()
        out.extend(group[(group[seed] == s) & (group[x] == cell)]["_y"].dropna().to_numpy(float).tolist())
    return out


def matched_loss_peaks(runs: pd.DataFrame, metric: str = "test_acc", x: str = "batch_size", by: str = "lr",
                       reached: str = "reached", min_reached: int = MIN_REACHED, confidence: float = 0.95,
                       seed: str = "seed") -> pd.DataFrame:
    """Per `by` group, where `metric` peaks along `x` among the included cells (reached_cells) of runs trained
    to a common train loss, and whether the peak is a peak.

    The curve is the seed mean of the runs that reached the target; x_best is its best included cell and
    x_opt the parabola vertex through it and its included neighbours (parabola_peak). `peaked`: x_best lies
    strictly inside the included range and the best cell, held out, beats both ends of that range, the
    smallest and the largest included x, by a Welch interval above 0 (low_* and high_* columns: best minus
    that end). Held out: each seed contributes its value at the cell that is best on the other seeds' mean,
    so that the choice of the best cell does not favour the seeds that make it. A group
    whose best cell is at an end of the trainable range is not peaked: its optimum is set by which batch
    sizes can reach the target, not by how the reached solutions generalize. at_grid_edge: x_best is the
    smallest or largest x tried (reached or not): the protocol's edge rule extends the grid there.
    """
    if metric not in runs:
        raise ConfigError(f"matched_loss_peaks: no column {metric!r} in the runs table")
    maximize = not lower_is_better(metric)
    data = _included_runs(runs, x, by, reached, min_reached)
    rows = []
    for key in sorted(runs[by].unique()):
        group = data[data[by] == key]
        grid = sorted(runs.loc[runs[by] == key, x].unique())
        row: dict[str, Any] = {by: key, "n_cells": int(group[x].nunique()), "x_low": math.nan, "x_high": math.nan,
                               "x_best": math.nan, "x_opt": math.nan, "y_best": math.nan, "interior": False,
                               "at_grid_edge": False, "peaked": False}
        for side in ("low", "high"):
            row.update({f"{side}_diff": math.nan, f"{side}_low": math.nan, f"{side}_high": math.nan})
        if len(group):
            values = pd.to_numeric(group[metric], errors="coerce")
            means = values.groupby(group[x]).mean().dropna()
            if len(means):
                peak = parabola_peak(means.index.to_numpy(float), means.to_numpy(float), maximize)
                x_low, x_high = float(means.index.min()), float(means.index.max())
                best = _held_out_best(group.assign(_y=values), x, seed, maximize)
                row.update(x_low=x_low, x_high=x_high, x_best=peak.x_best, x_opt=peak.x_peak, y_best=peak.y_best,
                           interior=peak.interior, at_grid_edge=peak.x_best in (float(grid[0]), float(grid[-1])))
                sign = 1.0 if maximize else -1.0          # a difference in the better direction is positive
                for side, end in (("low", x_low), ("high", x_high)):
                    other = values[group[x] == end].to_numpy(float)
                    d = welch_interval([sign * v for v in best], [sign * v for v in other], confidence)
                    row.update({f"{side}_diff": d.diff, f"{side}_low": d.low, f"{side}_high": d.high})
                row["peaked"] = bool(peak.interior and row["low_low"] > 0 and row["high_low"] > 0)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class MatchedLossSlopeTest(PreregisteredTest):
    """Smith & Le's mechanism test (docs/protocols.md, protocol v4): B_opt at a common train loss."""
    slopes: SeedSlopes       # power_law_by_seed on the runs that reached the target, in included cells
    peaks: pd.DataFrame      # matched_loss_peaks
    n_groups: int
    n_peaked: int
    min_peaked: int
    verdict: Verdict
    why: str
    extend_seeds: bool       # a deciding interval contains its threshold with < 8 seeds (statistics item 3)


def matched_loss_test(runs: pd.DataFrame, metric: str = "test_acc", x: str = "batch_size", by: str = "lr",
                      reached: str = "reached", seed: str = "seed", min_reached: int = MIN_REACHED,
                      min_peaked: int = MIN_PEAKED, confidence: float = 0.95) -> MatchedLossSlopeTest:
    """The verdict on B_opt read at a common train loss (runs with a target budget; `reached` flags the runs
    that stopped at it). reproduced: at least `min_peaked` groups are peaked (matched_loss_peaks) and the
    per-seed slope's t interval contains 1 with its lower end above 0 (slope_verdict); partly: the slope's
    lower end is above 0 and either fewer groups are peaked (but at least one) or the interval excludes 1;
    not reproduced: no group is peaked (the fixed-budget optimum was where the batch sizes stop reaching the
    target), or the slope's lower end is at or below 0; not testable: fewer than 2 groups, or (with a peaked
    group) no slope interval."""
    peaks = matched_loss_peaks(runs, metric, x, by, reached, min_reached, confidence, seed)
    data = _included_runs(runs, x, by, reached, min_reached)
    slopes = power_law_by_seed(data, metric, x, by, seed, confidence) if len(data) else \
        SeedSlopes((), math.nan, math.nan, math.nan, confidence, 0)
    n_groups, n_peaked = len(peaks), int(peaks["peaked"].sum()) if len(peaks) else 0
    slope_text = f"slope {slopes.mean:.3g} [{slopes.low:.3g}, {slopes.high:.3g}]"
    if n_groups < 2:
        verdict, why = Verdict.NOT_TESTABLE, f"{n_groups} group(s): a slope needs 2 or more"
    elif n_peaked == 0:
        verdict, why = Verdict.NOT_REPRODUCED, (f"no group peaks inside its trainable range at the common train loss "
                                                f"({slope_text})")
    elif slopes.verdict == Verdict.NOT_TESTABLE:
        verdict, why = Verdict.NOT_TESTABLE, f"{n_peaked} group(s) peaked, but no per-seed slope interval"
    elif slopes.verdict == Verdict.NOT_REPRODUCED:
        verdict, why = Verdict.NOT_REPRODUCED, f"{slope_text}: lower end <= 0 ({n_peaked} of {n_groups} groups peaked)"
    elif n_peaked >= min_peaked:
        verdict, why = slopes.verdict, f"{n_peaked} of {n_groups} groups peaked (>= {min_peaked}); {slope_text}"
    else:
        verdict, why = Verdict.PARTLY, f"{n_peaked} of {n_groups} groups peaked (< {min_peaked}); {slope_text}"
    n_seeds = int(data[seed].nunique()) if len(data) else 0
    undecided = peaks["interior"].astype(bool) & (
        ((peaks["low_low"] <= 0) & (peaks["low_high"] >= 0)) | ((peaks["high_low"] <= 0) & (peaks["high_high"] >= 0)))
    extend = verdict != Verdict.NOT_TESTABLE and n_seeds < 8 and (
        bool(undecided.any()) or (n_peaked > 0 and slopes.extend_seeds))
    return MatchedLossSlopeTest(slopes, peaks, n_groups, n_peaked, min_peaked, verdict, why, extend)


def argmax_argmin(runs: pd.DataFrame, metric: str = "test_acc", loss: str = "train_loss", x: str = "batch_size",
                  by: str = "lr") -> pd.DataFrame:
    """Per `by` group: the grid x with the best seed-mean `metric` and the one with the lowest seed-mean final
    `loss`, and whether they coincide (a fixed-budget optimum that sits where the training loss is lowest
    measures how far each batch size trains in the budget as much as how it generalizes). Runs whose values
    are missing are left out. Columns: `by`, x_best_metric, x_min_loss, same."""
    rows = []
    maximize = not lower_is_better(metric)
    for key, group in runs.groupby(by, sort=True):
        means = group.assign(_m=pd.to_numeric(group[metric], errors="coerce"),
                             _l=pd.to_numeric(group[loss], errors="coerce")).groupby(x)[["_m", "_l"]].mean()
        m, lo = means["_m"].dropna(), means["_l"].dropna()
        best = float(m.idxmax() if maximize else m.idxmin()) if len(m) else math.nan
        lowest = float(lo.idxmin()) if len(lo) else math.nan
        rows.append({by: key, "x_best_metric": best, "x_min_loss": lowest, "same": best == lowest})
    return pd.DataFrame(rows, columns=[by, "x_best_metric", "x_min_loss", "same"])


def _group_label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float, np.number)) else str(value)
