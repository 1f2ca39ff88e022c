"""Figures of Masters & Luschi (2018), the range of stable learning rates;
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.masters_luschi.

accuracy_vs_lr_plot, stable_range_plot, window_width_plot

Setting and pre-registered test: docs/protocols.md#masters-luschi.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...findings.masters_luschi import Trend, _cells
from .. import log2_batch_axis
from ..sweeps import axis_label


def accuracy_vs_lr_plot(ax: plt.Axes, runs: pd.DataFrame, metric: str = "test_acc", by: str = "batch_size",
                        lr: str = "lr") -> plt.Axes:
    """Mean `metric` over the seeds that finished against the lr (log axis), one line per batch size; an
    lr where some seed diverged is marked with a cross at the bottom of the axes in its batch size's
    colour, and the line breaks there (its finished seeds, if any, are not drawn: the lr counts as unstable)."""
    cells = _cells(runs, metric, by, lr)
    bottom = ax.get_xaxis_transform()   # x in data, y in axes fractions
    for i, (b, group) in enumerate(cells.groupby(by, sort=True)):
        # NaN at an unstable lr: the line breaks there instead of joining the stable lrs on either side
        mean = group["mean"].where(group["n_diverged"] == 0)
        ax.plot(group[lr], mean, "o-", color=f"C{i}", ms=4, label=f"B = {b}")
        failed = group[group["n_diverged"] > 0]
        ax.plot(failed[lr], np.full(len(failed), 0.03 + 0.04 * i), "x", color=f"C{i}", ms=6, mew=1.5,
                transform=bottom)
    ax.plot([], [], "x", color="0.3", label="diverged (some seed)")
    ax.set_xscale("log", base=2)
    ax.set(xlabel=axis_label(lr), ylabel=axis_label(metric))
    ax.legend(fontsize="small")
    return ax


def stable_range_plot(ax: plt.Axes, table: pd.DataFrame, intervals: pd.DataFrame | None = None,
                      by: str = "batch_size", label: str = "largest lr without divergence") -> plt.Axes:
    """Per batch size (log2 axis): the window of good lrs as a vertical bar, the best lr as a dot and the
    largest stable lr as a caret (`label`: what "stable" means in `table`); a hollow dot marks a best lr at the
    grid's edge. Log lr axis. Given `intervals` (stable_lr_intervals), the largest stable lr gets its bootstrap
    interval as an error bar."""
    data = table.dropna(subset=["best_lr"]).sort_values(by)
    b = data[by].to_numpy(float)
    ax.vlines(b, data["window_low"], data["window_high"], color="C0", lw=6, alpha=0.35,
              label="lrs within the margin of the best")
    edge = data["best_at_edge"].to_numpy(bool)
    ax.plot(b[~edge], data["best_lr"][~edge], "o", color="C0", label="best lr")
    if edge.any():
        ax.plot(b[edge], data["best_lr"][edge], "o", mfc="none", color="C0", label="best lr at the grid's edge")
    stable = table.dropna(subset=["max_stable_lr"]).sort_values(by)
    ax.plot(stable[by], stable["max_stable_lr"], "^-", color="C3", ms=5, lw=1, label=label)
    if intervals is not None:
        merged = stable.merge(intervals, on=by, how="left")
        err = np.vstack([merged["max_stable_lr"] - merged["max_stable_lr_low"],
                         merged["max_stable_lr_high"] - merged["max_stable_lr"]])
        ax.errorbar(merged[by], merged["max_stable_lr"], yerr=np.nan_to_num(np.clip(err, 0, None)), fmt="none",
                    ecolor="C3", capsize=3, lw=1)
    ax.set_yscale("log")
    log2_batch_axis(ax, "x", [int(v) for v in table[by]])
    ax.set(xlabel=axis_label(by), ylabel="learning rate")
    ax.legend(fontsize="small")
    return ax


def window_width_plot(ax: plt.Axes, table: pd.DataFrame, intervals: pd.DataFrame | None = None,
                      trend: Trend | None = None, by: str = "batch_size") -> plt.Axes:
    """The good window's width in octaves against the batch size (log2 axis), with its bootstrap interval
    per B (given `intervals`) and the least-squares line of the trend (given `trend`, its slope and
    interval in the legend)."""
    data = table.dropna(subset=["window_octaves"]).sort_values(by)
    b = data[by].to_numpy(float)
    ax.plot(b, data["window_octaves"], "o", color="C0", label="window width")
    if intervals is not None:
        merged = data.merge(intervals, on=by, how="left")
        err = np.vstack([merged["window_octaves"] - merged["window_octaves_low"],
                         merged["window_octaves_high"] - merged["window_octaves"]])
        ax.errorbar(b, merged["window_octaves"], yerr=np.nan_to_num(np.clip(err, 0, None)), fmt="none",
                    ecolor="C0", capsize=3, lw=1)
    if trend is not None and math.isfinite(trend.slope) and len(b) >= 2:
        x = np.log2(b)
        intercept = float(np.mean(data["window_octaves"].to_numpy(float)) - trend.slope * np.mean(x))
        ax.plot(b, intercept + trend.slope * x, "--", color="0.4",
                label=f"slope {trend.slope:.2f} per doubling [{trend.low:.2f}, {trend.high:.2f}]")
    log2_batch_axis(ax, "x", [int(v) for v in table[by]])
    ax.set(xlabel=axis_label(by), ylabel="window of good lrs (octaves)")
    ax.legend(fontsize="small")
    return ax
