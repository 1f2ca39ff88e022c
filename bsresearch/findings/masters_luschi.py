"""Masters & Luschi (2018), "Revisiting Small Batch Training for Deep Neural Networks": the range of
learning rates that train well narrows as the batch size grows, and the best results come from small
batches. Analysis and figure; no torch import.

    table = stable_lr_table(runs, "test_acc", margin=0.01)   # per batch size: largest stable lr, best lr, window
    trend = stable_range_trend(runs, "test_acc", margin=0.01)  # log2 slopes vs log2 B, bootstrap over seeds
    stable_range_plot(ax, table)

`runs` is a results.load table over a (batch size x lr) grid with seeds, all states included: a run that
diverged (state "diverged", or a non-finite metric) marks its lr unstable at its batch size. The lr
column is whatever the grid varied (`lr` with lr_scaling none, or the base lr under linear scaling, as in
the paper, which plots the base rate eta/B). Higher-is-better metrics only (accuracy).
Setting and pre-registered test: docs/protocols.md#masters-luschi.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..config import ConfigError
from ..plots import log2_batch_axis
from ..plots.sweeps import axis_label


def _cells(runs: pd.DataFrame, metric: str, by: str, lr: str) -> pd.DataFrame:
    """One row per (batch size, lr): n runs, n diverged, mean metric over the seeds that finished."""
    missing = [c for c in (metric, by, lr, "state") if c not in runs]
    if missing:
        raise ConfigError(f"stable_lr_table: the runs table has no column {missing[0]!r}")
    # Runs that crashed or ran out of memory say nothing about stability: left out. A finished run whose
    # metric is not finite counts as diverged.
    finished = runs[runs["state"].isin(("ok", "diverged"))]
    values = pd.to_numeric(finished[metric], errors="coerce")
    failed = (finished["state"] == "diverged") | ~np.isfinite(values.to_numpy(float))
    frame = finished.assign(_value=values.where(~failed), _failed=failed)
    return (frame.groupby([by, lr], sort=True)
            .agg(n=("_failed", "size"), n_diverged=("_failed", "sum"), mean=("_value", "mean"))
            .reset_index())


def stable_lr_table(runs: pd.DataFrame, metric: str = "test_acc", margin: float = 0.01, by: str = "batch_size",
                    lr: str = "lr") -> pd.DataFrame:
    """Per batch size: the largest stable lr, the best lr, and the window of good lrs around it.

    An lr is stable at a batch size when none of its seeds diverged. `best_lr` maximises the mean of
    `metric` over the stable lrs; the window is the contiguous run of stable grid lrs around it whose mean
    lies within `margin` (the metric's units) of the best. Columns: `by`, n_lrs, max_stable_lr (NaN when
    none is stable), best_lr, best, window_low, window_high, window_lrs (grid points in the window),
    window_octaves (log2 window_high/window_low), best_at_edge (the best lr is the grid's first or last:
    the window may extend beyond the grid), unstable_in_grid (some lr diverged: the boundary is measured).
    """
    cells = _cells(runs, metric, by, lr)
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


def stable_range_trend(runs: pd.DataFrame, metric: str = "test_acc", margin: float = 0.01,
                       by: str = "batch_size", lr: str = "lr", seed_column: str = "seed", n_boot: int = 1000,
                       confidence: float = 0.95, seed: int = 0) -> dict[str, Trend]:
    """Slopes against log2(B) of log2(max_stable_lr), log2(best_lr) and window_octaves, each with a
    bootstrap interval: the seeds are resampled with replacement (a seed keeps all its runs, which share
    their initial weights) and the table recomputed. Predicted by Masters & Luschi: max_stable_lr and the
    window shrink with B (negative slopes) when the lr is the base rate of linear scaling."""
    seeds = np.array(sorted(runs[seed_column].dropna().unique()))
    if len(seeds) < 2:
        raise ConfigError(f"stable_range_trend needs runs of 2 or more seeds; got {len(seeds)}")
    columns = ("max_stable_lr", "best_lr", "window_octaves")
    point = stable_lr_table(runs, metric, margin, by, lr)
    by_seed = {s: runs[runs[seed_column] == s] for s in seeds}
    rng = np.random.default_rng(seed)
    boots: dict[str, list[float]] = {c: [] for c in columns}
    for _ in range(n_boot):
        pick = rng.choice(seeds, size=len(seeds), replace=True)
        sample = pd.concat([by_seed[s] for s in pick], ignore_index=True)
        table = stable_lr_table(sample, metric, margin, by, lr)
        for c in columns:
            boots[c].append(_slope(table, c, by))
    tail = (1 - confidence) / 2
    out = {}
    for c in columns:
        values = np.array([v for v in boots[c] if math.isfinite(v)])
        low, high = (np.quantile(values, [tail, 1 - tail]) if len(values) else (math.nan, math.nan))
        out[c] = Trend(c, _slope(point, c, by), float(low), float(high), confidence, n_boot,
                       int(point[by].nunique()))
    return out


# ----------------------------------------------------------------------------- figure
def stable_range_plot(ax: plt.Axes, table: pd.DataFrame, by: str = "batch_size") -> plt.Axes:
    """Per batch size (log2 axis): the window of good lrs as a vertical bar, the best lr as a dot and the
    largest stable lr as a caret; a hollow dot marks a best lr at the grid's edge. Log lr axis."""
    data = table.dropna(subset=["best_lr"]).sort_values(by)
    b = data[by].to_numpy(float)
    ax.vlines(b, data["window_low"], data["window_high"], color="C0", lw=6, alpha=0.35,
              label="lrs within the margin of the best")
    edge = data["best_at_edge"].to_numpy(bool)
    ax.plot(b[~edge], data["best_lr"][~edge], "o", color="C0", label="best lr")
    if edge.any():
        ax.plot(b[edge], data["best_lr"][edge], "o", mfc="none", color="C0", label="best lr at the grid's edge")
    stable = table.dropna(subset=["max_stable_lr"]).sort_values(by)
    ax.plot(stable[by], stable["max_stable_lr"], "^-", color="C3", ms=5, lw=1, label="largest lr without divergence")
    ax.set_yscale("log")
    log2_batch_axis(ax, "x", [int(v) for v in table[by]])
    ax.set(xlabel=axis_label(by), ylabel="learning rate")
    ax.legend(fontsize="small")
    return ax
