"""Figures of Adam against SGD with momentum (Zhang et al. 2019; Nado et al. 2021);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.adam_vs_sgd.

steps_by_optimizer: steps to the target against batch size, one colour per optimizer, with each fit

Setting and pre-registered test: docs/protocols.md#adam-vs-sgd.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...findings.adam_vs_sgd import OPTIMIZER, STEPS
from ...measure.critical import CriticalBatchFit
from .. import log2_batch_axis


def steps_by_optimizer(ax: plt.Axes, points: pd.DataFrame, fits: dict[str, CriticalBatchFit],
                       optimizer: str = OPTIMIZER, y: str = STEPS) -> plt.Axes:
    """Steps to the target at the tuned lr against batch size, one colour per optimizer: each seed in the
    fit (faint; x: reached the target but its batch size is left out of the fit), the mean over them, the
    fitted S_min (1 + B_crit/B) and B_crit (dotted) with its interval (a bar along the bottom, one height
    per optimizer)."""
    for i, (name, group) in enumerate(points.groupby(optimizer, sort=True)):
        color = f"C{i}"
        data = group[group["in_fit"].astype(bool)]
        ax.scatter(data["batch_size"], data[y], s=10, color=color, alpha=0.4, linewidths=0)
        left_out = group[group["reached"].astype(bool) & ~group["in_fit"].astype(bool)]
        if len(left_out):
            ax.scatter(left_out["batch_size"], left_out[y], s=14, marker="x", color=color, linewidths=0.8,
                       label=f"{name}: reached, not in the fit")
        mean = data.groupby("batch_size")[y].mean()
        if len(mean):
            ax.plot(mean.index, mean.to_numpy(), "o", color=color, label=f"{name}: mean over seeds")
        if name in fits:
            fit = fits[name]
            grid = np.geomspace(points["batch_size"].min() / 1.5, points["batch_size"].max() * 1.5, 200)
            ax.plot(grid, fit.predict_steps(grid), "-", color=color, linewidth=1,
                    label=f"{name}: S_min {fit.s_min:.3g}, B_crit {fit.b_crit:.3g}")
            ax.axvline(fit.b_crit, color=color, linestyle=":", linewidth=1)
            low, high = fit.b_crit_interval
            if np.isfinite(low) and np.isfinite(high):
                ax.plot([low, high], [0.03 + 0.04 * i] * 2, transform=ax.get_xaxis_transform(), color=color,
                        linewidth=4, solid_capstyle="butt", label=f"{name}: B_crit {fit.confidence:.0%} interval")
    log2_batch_axis(ax, "x", [int(v) for v in sorted(points["batch_size"].unique())])
    if (pd.to_numeric(points.loc[points["reached"].astype(bool), y], errors="coerce") > 0).any():
        ax.set_yscale("log")
    ax.set(xlabel="batch size (examples per update)", ylabel="steps to target")
    ax.legend(fontsize=7)
    return ax
