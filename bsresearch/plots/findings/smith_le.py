"""Figures of Smith & Le (2018), the optimal batch size follows lr N;
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.smith_le.

mark_optima, metric_vs_batch_optima, slope_lines, optimum_scaling, metric_vs_noise_scale,
agreement_plot, matched_curves_plot, optima_vs_lr_plot

Setting and pre-registered test: docs/protocols.md#smith-le.
"""
from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...findings.smith_le import (
    MIN_REACHED,
    MatchedLossSlopeTest,
    Optimum,
    PowerLaw,
    SeedSlopes,
    _group_label,
    _included_runs,
    sgd_noise_scale,
)
from .. import interval_err, log2_batch_axis
from ..sweeps import (
    CI,
    axis_label,
    categorical,
    metric_vs_batch,
)


def mark_optima(ax: plt.Axes, optimum: Optimum, y_offset: float = 0.0) -> plt.Axes:
    """On a metric-vs-batch plot: each group's B_opt (diamond at the best seed mean, shifted by y_offset)
    with its bootstrap interval as a horizontal bar; open diamonds where the peak is at the grid's edge.

    Colours follow the order of the groups, as metric_vs_batch's hue does (matplotlib's colour cycle).
    """
    for i, row in enumerate(optimum.table.sort_values(optimum.by).itertuples(index=False)):
        row = row._asdict()
        color = f"C{i % 10}"
        err = [[row["x_opt"] - row["x_opt_low"]], [row["x_opt_high"] - row["x_opt"]]]
        ax.errorbar([row["x_opt"]], [row["y_best"] + y_offset], xerr=err, fmt="D", color=color, capsize=3,
                    markersize=6, markerfacecolor=color if row["interior"] else "white", zorder=5)
    return ax


def metric_vs_batch_optima(ax: plt.Axes, runs: pd.DataFrame, optimum: Optimum, y: str = "test_acc",
                           **kwargs: Any) -> plt.Axes:
    """`y` against batch size, one line per group of `optimum` (e.g. lr: mean and 95% interval over seeds),
    with each group's B_opt and its interval marked (mark_optima)."""
    metric_vs_batch(ax, runs, y, hue=optimum.by, **kwargs)
    mark_optima(ax, optimum)
    legend = ax.get_legend()
    if legend is not None:
        legend.set_title(axis_label(optimum.by))
    return ax


def slope_lines(ax: plt.Axes, x: np.ndarray, y: np.ndarray, use: np.ndarray, primary: SeedSlopes | None = None,
                predicted_slope: float = 1.0, predicted_style: str = ":") -> None:
    """Power laws through the geometric mean of the points (x, y) selected by `use` (all of them when none
    is), on log-log axes: the predicted slope (grey, `predicted_style`) and, given `primary`, the
    pre-registered mean per-seed slope (solid red, with its t interval in the legend)."""
    use = use if use.any() else np.ones_like(use)
    gx, gy = np.exp(np.log(x[use]).mean()), np.exp(np.log(y[use]).mean())
    span = np.geomspace(x.min() / 1.3, x.max() * 1.3, 50)
    if primary is not None and np.isfinite(primary.mean):
        ax.plot(span, gy * (span / gx) ** primary.mean, "-", color="C3", lw=2,
                label=f"pre-registered: {primary.mean:.2f} [{primary.low:.2f}, {primary.high:.2f}]")
    ax.plot(span, gy * (span / gx) ** predicted_slope, predicted_style, color="0.5",
            label=f"predicted: slope {predicted_slope:g}")


def optimum_scaling(ax: plt.Axes, optimum: Optimum, fit: PowerLaw | None = None, predicted_slope: float = 1.0,
                    primary: SeedSlopes | None = None) -> plt.Axes:
    """B_opt against the group value (lr or N) on log-log axes, with bootstrap intervals; a line of the
    predicted slope through the points' geometric mean. With `primary` (power_law_by_seed, the pre-registered
    statistic), its mean slope is the solid line through the same point, labelled with its t interval, and
    the bootstrap fit of the seed-mean peaks (`fit`, secondary) is dotted; without it, the fit is solid.
    Open markers: peaks at the grid's edge (censored, left out of the fit)."""
    table = optimum.table.sort_values(optimum.by)
    x = table[optimum.by].to_numpy(float)
    b = table["x_opt"].to_numpy(float)
    err = interval_err(b, table["x_opt_low"], table["x_opt_high"])
    interior = table["interior"].to_numpy(bool)
    ax.errorbar(x[interior], b[interior], yerr=err[:, interior], fmt="o", color="C0", capsize=3,
                label=f"B_opt, {optimum.confidence:.0%} bootstrap")
    if (~interior).any():
        ax.errorbar(x[~interior], b[~interior], yerr=err[:, ~interior], fmt="o", color="C0", capsize=3,
                    markerfacecolor="white", label="peak at the grid's edge (censored)")
    if fit is not None and np.isfinite(fit.slope):
        span = np.geomspace(x.min() / 1.3, x.max() * 1.3, 50)
        ax.plot(span, fit.predict(span), ":" if primary is not None else "-", color="C1",
                label=("bootstrap fit" if primary is not None else "fit")
                + f": {fit.slope:.2f} [{fit.slope_low:.2f}, {fit.slope_high:.2f}]")
    slope_lines(ax, x, b, interior, primary, predicted_slope, "--")
    ax.set_xscale("log")
    ax.set_xticks(x, [_group_label(v) for v in x])
    ax.minorticks_off()
    log2_batch_axis(ax, "y")
    ax.set(xlabel=axis_label(optimum.by), ylabel="best batch size B_opt")
    ax.legend(fontsize="x-small", loc="upper left")
    return ax


def metric_vs_noise_scale(ax: plt.Axes, runs: pd.DataFrame, y: str = "test_acc", hue: str = "lr",
                          errorbar: Any = CI, **kwargs: Any) -> plt.Axes:
    """`y` against Smith & Le's noise scale g = lr N / (B (1 - m)) (log axis), mean and 95% t interval over
    seeds, one line per `hue`: if g alone sets the outcome, the lines fall on one curve.

    Uses the runs' effective_lr (after any batch-size scaling), n_train, batch_size and momentum columns.
    """
    import seaborn as sns
    data = runs.dropna(subset=[y]).assign(
        noise_scale=lambda d: sgd_noise_scale(d["effective_lr"].astype(float), d["n_train"].astype(float),
                                          d["batch_size"].astype(float), d["momentum"].astype(float)))
    data, order = categorical(data, hue)
    sns.lineplot(data=data, x="noise_scale", y=y, hue=hue, hue_order=order, errorbar=errorbar, marker="o",
                 err_style="bars", seed=0, ax=ax, **kwargs)
    ax.set_xscale("log")
    ax.set(xlabel="noise scale g = lr N / (B (1 - m))", ylabel=axis_label(y))
    legend = ax.get_legend()
    if legend is not None:
        legend.set_title(axis_label(hue))
    return ax


def agreement_plot(ax: plt.Axes, table: pd.DataFrame, by: str = "batch_size", label: str | None = None,
                   color: str | None = None, scale: float = 100.0,
                   unit: str = "percentage points") -> plt.Axes:
    """An `agreement` table: each group's mean minus the reference's, with the Welch
    interval, against `by` (log2 axis); groups with a diverged run are marked with a red x at the bottom.
    The differences are multiplied by `scale` (100: an accuracy fraction drawn in percentage points)."""
    x = table[by].to_numpy(float)
    diff = scale * table["diff"].to_numpy(float)
    low, high = scale * table["diff_low"].to_numpy(float), scale * table["diff_high"].to_numpy(float)
    err = np.vstack([diff - low, high - diff])
    ax.errorbar(x, diff, yerr=np.nan_to_num(err), fmt="o-", capsize=3, label=label, color=color)
    ax.axhline(0.0, color="0.5", linewidth=1, linestyle=":")
    diverged = table["n_diverged"].to_numpy(int) > 0
    if diverged.any():
        bottom = np.nanmin(np.concatenate([diff, low]))
        ax.plot(x[diverged], np.full(diverged.sum(), bottom), "x", color="red", markersize=9,
                label="a run diverged" if label is None else f"{label}: a run diverged")
    log2_batch_axis(ax, "x", [int(v) for v in x])
    ax.set(xlabel=axis_label(by), ylabel=f"difference from the smallest batch ({unit})")
    ax.legend(fontsize="small")
    return ax


def matched_curves_plot(ax: plt.Axes, runs: pd.DataFrame, test: MatchedLossSlopeTest, metric: str = "test_acc",
                        x: str = "batch_size", by: str = "lr", reached: str = "reached",
                        min_reached: int = MIN_REACHED) -> plt.Axes:
    """The matched-loss curves the test reads: `metric` against `x` per `by` group over the runs that reached
    the target in included cells (mean and 95% interval over seeds), and each group's B_opt (parabola vertex) as
    a diamond at its best seed mean, filled where the group is peaked (its best cell beats both ends of the
    trainable range), open where it is not."""
    data = _included_runs(runs, x, by, reached, min_reached)
    metric_vs_batch(ax, data, metric, hue=by)
    for i, row in enumerate(test.peaks.sort_values(by).itertuples(index=False)):
        if math.isfinite(row.x_opt):
            color = f"C{i % 10}"
            ax.plot([row.x_opt], [row.y_best], "D", ms=8, color=color, mfc=color if row.peaked else "white",
                    zorder=5)
    ax.plot([], [], "D", color="0.3", label="B_opt, peaked")
    ax.plot([], [], "D", color="0.3", mfc="white", label="B_opt, not peaked")
    ax.legend(fontsize="x-small", title=axis_label(by))
    return ax


def optima_vs_lr_plot(ax: plt.Axes, matched: pd.DataFrame, fixed: pd.DataFrame | None = None,
                      slopes: SeedSlopes | None = None, by: str = "lr", fixed_label: str = "fixed budget") -> plt.Axes:
    """B_opt against the lr on log-log axes: at the common train loss (`matched`: matched_loss_peaks; filled
    where peaked) and, beside it, at the fixed budget (`fixed`: an Optimum.table, x_opt per group; grey). With
    `slopes`, the pre-registered mean per-seed slope is drawn through the matched points' geometric mean, with
    its t interval in the legend, beside the predicted slope 1."""
    m = matched.dropna(subset=["x_opt"]).sort_values(by)
    if fixed is not None and len(fixed):
        f = fixed.sort_values(by)
        ax.plot(f[by], f["x_opt"], "s--", color="0.55", label=fixed_label)
    peaked = m["peaked"].astype(bool).to_numpy()
    ax.plot(m[by][peaked], m["x_opt"][peaked], "D", color="C0", ms=8, label="common train loss, peaked")
    ax.plot(m[by][~peaked], m["x_opt"][~peaked], "D", color="C0", mfc="white", ms=8,
            label="common train loss, not peaked")
    if len(m):
        slope_lines(ax, m[by].to_numpy(float), m["x_opt"].to_numpy(float), peaked, slopes)
    ax.set_xscale("log")
    log2_batch_axis(ax, "y")
    ax.set(xlabel=axis_label(by), ylabel="best batch size B_opt")
    ax.legend(fontsize="x-small")
    return ax
