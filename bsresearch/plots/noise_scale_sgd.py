"""Figures for Smith & Le (2018) and Jastrzebski et al. (2017): the best batch size and SGD's noise scale.

Each function draws on the Axes it is given, from a results table (bsresearch.results) or a
bsresearch.optimum result, and returns the Axes. No torch import.
"""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..optimum import Optimum, PowerLaw, noise_scale
from . import log2_batch_axis
from .sweeps import _categorical, _label, metric_vs_batch


def _group_label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, (int, float, np.number)) else str(value)


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
        legend.set_title(_label(optimum.by))
    return ax


def optimum_scaling(ax: plt.Axes, optimum: Optimum, fit: PowerLaw | None = None, predicted_slope: float = 1.0
                    ) -> plt.Axes:
    """B_opt against the group value (lr or N) on log-log axes, with bootstrap intervals; the fitted power
    law with its slope interval, and a line of the predicted slope through the points' geometric mean.
    Open markers: peaks at the grid's edge (censored, left out of the fit)."""
    table = optimum.table.sort_values(optimum.by)
    x = table[optimum.by].to_numpy(float)
    b = table["x_opt"].to_numpy(float)
    err = np.vstack([b - table["x_opt_low"].to_numpy(float), table["x_opt_high"].to_numpy(float) - b])
    interior = table["interior"].to_numpy(bool)
    ax.errorbar(x[interior], b[interior], yerr=err[:, interior], fmt="o", color="C0", capsize=3,
                label=f"B_opt, {optimum.confidence:.0%} bootstrap interval")
    if (~interior).any():
        ax.errorbar(x[~interior], b[~interior], yerr=err[:, ~interior], fmt="o", color="C0", capsize=3,
                    markerfacecolor="white", label="peak at the grid's edge (censored)")
    span = np.geomspace(x.min() / 1.3, x.max() * 1.3, 50)
    if fit is not None and np.isfinite(fit.slope):
        ax.plot(span, fit.predict(span), "-", color="C1",
                label=f"fit: slope {fit.slope:.2f} [{fit.slope_low:.2f}, {fit.slope_high:.2f}]")
    use = interior if interior.any() else np.ones_like(interior)
    anchor_x, anchor_b = np.exp(np.log(x[use]).mean()), np.exp(np.log(b[use]).mean())
    ax.plot(span, anchor_b * (span / anchor_x) ** predicted_slope, "--", color="0.5",
            label=f"predicted: slope {predicted_slope:g}")
    ax.set_xscale("log")
    ax.set_xticks(x, [_group_label(v) for v in x])
    ax.minorticks_off()
    log2_batch_axis(ax, "y")
    ax.set(xlabel=_label(optimum.by), ylabel="best batch size B_opt")
    ax.legend(fontsize="small")
    return ax


def metric_vs_noise_scale(ax: plt.Axes, runs: pd.DataFrame, y: str = "test_acc", hue: str = "lr",
                          errorbar: Any = ("ci", 95), **kwargs: Any) -> plt.Axes:
    """`y` against Smith & Le's noise scale g = lr N / (B (1 - m)) (log axis), mean and 95% interval over
    seeds, one line per `hue`: if g alone sets the outcome, the lines fall on one curve.

    Uses the runs' effective_lr (after any batch-size scaling), n_train, batch_size and momentum columns.
    """
    import seaborn as sns
    data = runs.dropna(subset=[y]).assign(
        noise_scale=lambda d: noise_scale(d["effective_lr"].astype(float), d["n_train"].astype(float),
                                          d["batch_size"].astype(float), d["momentum"].astype(float)))
    data, order = _categorical(data, hue)
    sns.lineplot(data=data, x="noise_scale", y=y, hue=hue, hue_order=order, errorbar=errorbar, marker="o",
                 err_style="bars", seed=0, ax=ax, **kwargs)
    ax.set_xscale("log")
    ax.set(xlabel="noise scale g = lr N / (B (1 - m))", ylabel=_label(y))
    legend = ax.get_legend()
    if legend is not None:
        legend.set_title(_label(hue))
    return ax


def agreement_plot(ax: plt.Axes, table: pd.DataFrame, by: str = "batch_size", label: str | None = None,
                   color: str | None = None) -> plt.Axes:
    """A bsresearch.optimum.agreement table: each group's mean minus the reference's, with the Welch
    interval, against `by` (log2 axis); groups with a diverged run are marked with a red x at the bottom."""
    x = table[by].to_numpy(float)
    diff = table["diff"].to_numpy(float)
    err = np.vstack([diff - table["diff_low"].to_numpy(float), table["diff_high"].to_numpy(float) - diff])
    ax.errorbar(x, diff, yerr=np.nan_to_num(err), fmt="o-", capsize=3, label=label, color=color)
    ax.axhline(0.0, color="0.5", linewidth=1, linestyle=":")
    diverged = table["n_diverged"].to_numpy(int) > 0
    if diverged.any():
        bottom = np.nanmin(np.concatenate([diff, table["diff_low"].to_numpy(float)]))
        ax.plot(x[diverged], np.full(diverged.sum(), bottom), "x", color="red", markersize=9,
                label="a run diverged" if label is None else f"{label}: a run diverged")
    log2_batch_axis(ax, "x", [int(v) for v in x])
    ax.set(xlabel=_label(by), ylabel="difference from the smallest batch")
    ax.legend(fontsize="small")
    return ax
