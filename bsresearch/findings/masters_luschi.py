"""Masters & Luschi (2018), "Revisiting Small Batch Training for Deep Neural Networks": the range of
learning rates that train well narrows as the batch size grows, and the best results come from small
batches. No torch import.

    table = stable_lr_table(runs, "test_acc", margin=0.01)   # per batch size: largest stable lr, best lr, window
    trend = stable_range_trend(runs, "test_acc", margin=0.01)  # log2 slopes vs log2 B, bootstrap over seeds
    test = range_test(table, trend)                            # the pre-registered verdict
    learning_range_test(runs, learns=LEARNS)                    # v4: "stable" = every seed learns (accuracy >= 0.5)
    figures.stable_range_plot(ax, table, stable_lr_intervals(runs, "test_acc", margin=0.01))

`runs` is a results.load table over a (batch size x lr) grid with seeds, all states included: a run that
diverged (state "diverged", or a non-finite metric) marks its lr unstable at its batch size. The lr
column is whatever the grid varied (`lr` with lr_scaling none, or the base lr under linear scaling, as in
the paper, which plots the base rate eta/B). Higher-is-better metrics only (accuracy).
Setting and pre-registered test: docs/protocols.md#masters-luschi.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.masters_luschi (`figures` above).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config import ConfigError
from .verdict import PreregisteredTest, Verdict

LEARNS = 0.5   # protocol v4: a run learns when its final test accuracy is at least this (chance on 10 classes: 0.1)


def _cells(runs: pd.DataFrame, metric: str, by: str, lr: str, learns: float | None = None) -> pd.DataFrame:
    """One row per (batch size, lr): n runs, n diverged, mean metric over the seeds that finished. With
    `learns`, a finished run whose metric is below it counts as diverged (it did not learn)."""
    missing = [c for c in (metric, by, lr, "state") if c not in runs]
    if missing:
        raise ConfigError(f"stable_lr_table: the runs table has no column {missing[0]!r}")
    # Runs that crashed or ran out of memory say nothing about stability: left out. A finished run whose
    # metric is not finite counts as diverged.
    finished = runs[runs["state"].isin(("ok", "diverged"))]
    values = pd.to_numeric(finished[metric], errors="coerce")
    failed = (finished["state"] == "diverged") | ~np.isfinite(values.to_numpy(float))
    if learns is not None:   # protocol v4: stable means the run learns, not only that it ended without a NaN
        failed = failed | (values < learns)
    frame = finished.assign(_value=values.where(~failed), _failed=failed)
    return (frame.groupby([by, lr], sort=True)
            .agg(n=("_failed", "size"), n_diverged=("_failed", "sum"), mean=("_value", "mean"))
            .reset_index())


def stable_lr_table(runs: pd.DataFrame, metric: str = "test_acc", margin: float = 0.01, by: str = "batch_size",
                    lr: str = "lr", learns: float | None = None) -> pd.DataFrame:
    """Per batch size: the largest stable lr, the best lr, and the window of good lrs around it.

    An lr is stable at a batch size when none of its seeds diverged; with `learns` (protocol v4, e.g.
    LEARNS = 0.5), when also every seed ended with `metric` >= learns: a run stuck near chance is not stable.
    `best_lr` maximises the mean of `metric` over the stable lrs; the window is the contiguous run of stable
    grid lrs around it whose mean lies within `margin` (the metric's units) of the best. Columns: `by`,
    n_lrs, max_stable_lr (NaN when none is stable), best_lr, best, window_low, window_high, window_lrs (grid
    points in the window), window_octaves (log2 window_high/window_low), best_at_edge (the best lr is the
    grid's first or last: the window may extend beyond the grid), unstable_in_grid (some lr diverged, or with
    `learns` did not learn: the boundary is measured).
    """
    cells = _cells(runs, metric, by, lr, learns)
    rows = []
    for b, group in cells.groupby(by, sort=True):
        group = group.sort_values(lr).reset_index(drop=True)
        stable = group[group["n_diverged"] == 0]
        row = {by: b, "n_lrs": len(group), "max_stable_lr": float(stable[lr].max()) if len(stable) else math.nan,
               "unstable_in_grid": bool((group["n_diverged"] > 0).any())}
        scored = stable.dropna(subset=["mean"])
        if not len(scored):
            rows.append({**row, "best_lr": math.nan, "best": math.nan, "window_low": math.nan,
                         "window_high": math.nan, "window_lrs": 0, "window_octaves": math.nan,
                         "best_at_edge": False})
            continue
        k = int(scored["mean"].idxmax())
        best = float(group.loc[k, "mean"])
        good = (group["n_diverged"] == 0) & (group["mean"] >= best - margin)
        low = high = k
        while low - 1 >= 0 and good[low - 1]:
            low -= 1
        while high + 1 < len(group) and good[high + 1]:
            high += 1
        w_low, w_high = float(group.loc[low, lr]), float(group.loc[high, lr])
        rows.append({**row, "best_lr": float(group.loc[k, lr]), "best": best, "window_low": w_low,
                     "window_high": w_high, "window_lrs": high - low + 1,
                     "window_octaves": math.log2(w_high / w_low),
                     "best_at_edge": k in (0, len(group) - 1)})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Trend:
    """How a column of stable_lr_table changes with log2(batch size): the least-squares slope of
    log2(value) (window_octaves as it is) against log2(B), with a percentile bootstrap interval over seeds."""
    column: str
    slope: float
    low: float
    high: float
    confidence: float
    n_boot: int
    n_batch_sizes: int


def _slope(table: pd.DataFrame, column: str, by: str) -> float:
    data = table[[by, column]].dropna()
    y = data[column].to_numpy(float)
    if column != "window_octaves":
        y = np.log2(y)
    x = np.log2(data[by].to_numpy(float))
    if len(x) < 2 or np.ptp(x) == 0:
        return math.nan
    return float(np.polyfit(x, y, 1)[0])


COLUMNS = ("max_stable_lr", "best_lr", "window_octaves")   # the columns with a trend and intervals


def _bootstrap_tables(runs: pd.DataFrame, metric: str, margin: float, by: str, lr: str, seed_column: str,
                      n_boot: int, seed: int, caller: str, learns: float | None = None) -> Iterator[pd.DataFrame]:
    """stable_lr_table of `n_boot` resamples of the seeds with replacement (a seed keeps all its runs,
    which share their initial weights). The same `seed` gives the same resamples in every caller."""
    seeds = np.array(sorted(runs[seed_column].dropna().unique()))
    if len(seeds) < 2:
        raise ConfigError(f"{caller} needs runs of 2 or more seeds; got {len(seeds)}")
    by_seed = {s: runs[runs[seed_column] == s] for s in seeds}
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        pick = rng.choice(seeds, size=len(seeds), replace=True)
        yield stable_lr_table(pd.concat([by_seed[s] for s in pick], ignore_index=True), metric, margin, by, lr,
                              learns)


def stable_range_trend(runs: pd.DataFrame, metric: str = "test_acc", margin: float = 0.01,
                       by: str = "batch_size", lr: str = "lr", seed_column: str = "seed", n_boot: int = 1000,
                       confidence: float = 0.95, seed: int = 0, learns: float | None = None) -> dict[str, Trend]:
    """Slopes against log2(B) of log2(max_stable_lr), log2(best_lr) and window_octaves, each with a
    bootstrap interval: the seeds are resampled with replacement (a seed keeps all its runs, which share
    their initial weights) and the table recomputed. Predicted by Masters & Luschi: max_stable_lr and the
    window shrink with B (negative slopes) when the lr is the base rate of linear scaling. `learns`: as in
    stable_lr_table."""
    columns = COLUMNS
    boots: dict[str, list[float]] = {c: [] for c in columns}
    for table in _bootstrap_tables(runs, metric, margin, by, lr, seed_column, n_boot, seed, "stable_range_trend",
                                   learns):
        for c in columns:
            boots[c].append(_slope(table, c, by))
    point = stable_lr_table(runs, metric, margin, by, lr, learns)
    tail = (1 - confidence) / 2
    out = {}
    for c in columns:
        values = np.array([v for v in boots[c] if math.isfinite(v)])
        low, high = (np.quantile(values, [tail, 1 - tail]) if len(values) else (math.nan, math.nan))
        out[c] = Trend(c, _slope(point, c, by), float(low), float(high), confidence, n_boot,
                       int(point[by].nunique()))
    return out


def stable_lr_intervals(runs: pd.DataFrame, metric: str = "test_acc", margin: float = 0.01,
                        by: str = "batch_size", lr: str = "lr", seed_column: str = "seed", n_boot: int = 1000,
                        confidence: float = 0.95, seed: int = 0, learns: float | None = None) -> pd.DataFrame:
    """Per batch size, percentile bootstrap intervals over seeds (the resamples of stable_range_trend with
    the same `seed`) of max_stable_lr, best_lr and window_octaves: columns `by`, <column>_low, <column>_high.
    Values are grid points, so an interval is a range of grid lrs; a resample in which no lr is stable (or
    none scores) counts as NaN and is left out."""
    boots = pd.concat(list(_bootstrap_tables(runs, metric, margin, by, lr, seed_column, n_boot, seed,
                                             "stable_lr_intervals", learns)), ignore_index=True)
    tail = (1 - confidence) / 2
    rows = []
    for b, group in boots.groupby(by, sort=True):
        row: dict[str, float] = {by: b}
        for c in COLUMNS:
            values = group[c].dropna().to_numpy(float)
            low, high = np.quantile(values, [tail, 1 - tail]) if len(values) else (math.nan, math.nan)
            row.update({f"{c}_low": float(low), f"{c}_high": float(high)})
        rows.append(row)
    return pd.DataFrame(rows)


# Grid lrs are powers of 2 and widths whole octaves: a slope that is 0 can come out of the fit as -3e-16.
# An interval ending within this of 0 ends at 0, and so does not lie below it.
ZERO = 1e-9


def below_zero(trend: Trend) -> bool:
    """The trend's interval lies below 0 (its upper end below -ZERO)."""
    return trend.high < -ZERO


@dataclass(frozen=True)
class RangeTest(PreregisteredTest):
    """The pre-registered test (docs/protocols.md#masters-luschi): both slopes' intervals below 0."""
    max_stable_lr: Trend       # slope of log2(largest stable lr) against log2(B)
    window_octaves: Trend      # slope of the good window's width (octaves) against log2(B)
    verdict: Verdict
    reason: str                # why not testable ("" otherwise)


def range_test(table: pd.DataFrame, trend: dict[str, Trend], by: str = "batch_size") -> RangeTest:
    """The verdict: not testable when at some B no lr of the grid diverged or the best lr is at the grid's
    edge (the boundary or the window is cut by the grid), or when a slope has no interval; otherwise
    reproduced when both intervals lie below 0, partly when one does, not reproduced when neither."""
    a, w = trend["max_stable_lr"], trend["window_octaves"]
    problems = []
    no_boundary = table.loc[~table["unstable_in_grid"].astype(bool), by].tolist()
    if no_boundary:
        problems.append(f"no lr of the grid diverged at B = {', '.join(map(str, no_boundary))}")
    edge = table.loc[table["best_at_edge"].astype(bool), by].tolist()
    if edge:
        problems.append(f"the best lr is at the grid's edge at B = {', '.join(map(str, edge))}")
    if not all(math.isfinite(v) for v in (a.low, a.high, w.low, w.high)):
        problems.append("a slope has no bootstrap interval (fewer than 2 batch sizes with a value)")
    if problems:
        return RangeTest(a, w, Verdict.NOT_TESTABLE, "; ".join(problems))
    below = int(below_zero(a)) + int(below_zero(w))
    return RangeTest(a, w, {2: Verdict.REPRODUCED, 1: Verdict.PARTLY, 0: Verdict.NOT_REPRODUCED}[below], "")


MIN_LEARNING_BATCHES = 4   # protocol v4: batch sizes with an lr at which every seed learns, needed for the test


@dataclass(frozen=True)
class LearningRangeTest:
    """The mechanism test (docs/protocols.md, protocol v4): range_test with "stable" meaning every seed learns."""
    table: pd.DataFrame      # stable_lr_table(..., learns=learns)
    trend: dict[str, Trend]  # stable_range_trend(..., learns=learns)
    test: RangeTest          # range_test's verdict, or not testable for too few learning batch sizes
    learns: float
    no_learning: tuple[float, ...]   # batch sizes at which no lr of the grid learns (left out of the slopes)


def learning_range_test(runs: pd.DataFrame, learns: float = LEARNS, metric: str = "test_acc", margin: float = 0.01,
                        by: str = "batch_size", lr: str = "lr", seed_column: str = "seed", n_boot: int = 2000,
                        confidence: float = 0.95, seed: int = 0,
                        min_batch_sizes: int = MIN_LEARNING_BATCHES) -> LearningRangeTest:
    """range_test on stable_lr_table and stable_range_trend with `learns`: an lr is stable at B when every seed
    finished without diverging and ended with `metric` >= learns. A batch size at which no lr learns has no
    largest learning lr: it is named in no_learning and left out of the slopes (its learning range is empty, the
    narrowest there is, so leaving it out works against the claim); with fewer than `min_batch_sizes` batch
    sizes that have one, the verdict is not testable."""
    table = stable_lr_table(runs, metric, margin, by, lr, learns)
    trend = stable_range_trend(runs, metric, margin, by, lr, seed_column, n_boot, confidence, seed, learns)
    test = range_test(table, trend, by)
    missing = tuple(float(b) for b in table.loc[table["max_stable_lr"].isna(), by])
    n_with = int(table["max_stable_lr"].notna().sum())
    if n_with < min_batch_sizes:
        reason = (f"{n_with} batch sizes have an lr at which every seed learns (>= {min_batch_sizes} needed; none at "
                  f"B = {', '.join(f'{b:g}' for b in missing)})")
        test = RangeTest(test.max_stable_lr, test.window_octaves, Verdict.NOT_TESTABLE,
                         "; ".join(r for r in (test.reason, reason) if r))
    return LearningRangeTest(table, trend, test, learns, missing)
