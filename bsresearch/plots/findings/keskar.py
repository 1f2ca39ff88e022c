"""Figures of Keskar et al. (2017), large batches find sharper minima;
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.keskar.

paired_test_plot (what decides the test), interpolation_plot (the parametric plot)

Setting and pre-registered test: docs/protocols.md#keskar.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
import pandas as pd

from ...findings.keskar import KeskarTest


def paired_test_plot(ax_ratio: plt.Axes, ax_drop: plt.Axes, pairs: pd.DataFrame, test: KeskarTest) -> None:
    """The deciding statistics as the eye should read them: each seed's paired ratio (log axis) and accuracy
    drop (points), the estimate with its t interval at the right, and each threshold (ratio 1, drop 0) as a
    red line; the interval must clear the line."""
    sides = [(ax_ratio, pairs["ratio"], (test.ratio, test.ratio_low, test.ratio_high), 1.0,
              f"phi ratio B={test.large_batch} / B={test.small_batch}", "geometric mean"),
             (ax_drop, 100 * pairs["drop"], (100 * test.drop, 100 * test.drop_low, 100 * test.drop_high), 0.0,
              f"test accuracy B={test.small_batch} - B={test.large_batch} (points)", "mean")]
    for ax, values, (est, low, high), threshold, label, name in sides:
        x = np.arange(len(values))
        ax.scatter(x, values, color="0.4", zorder=3, label="one seed (paired)")
        ax.errorbar([len(values) + 0.5], [est], yerr=[[est - low], [high - est]], fmt="D", color="C0",
                    capsize=5, zorder=4, label=f"{name}, {test.n_pairs}-seed 95% t interval")
        ax.axhline(threshold, color="C3", lw=1.5, label=f"threshold: interval above {threshold:g}")
        ax.set_xticks([*x, len(values) + 0.5], [f"seed {int(s)}" for s in pairs["seed"]] + [name],
                      rotation=45, ha="right", fontsize="small")
        ax.set_ylabel(label)
        ax.legend(fontsize="x-small")
    ax_ratio.set_yscale("log")
    ax_ratio.yaxis.set_major_locator(mticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax_ratio.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax_ratio.yaxis.set_minor_formatter(mticker.NullFormatter())
    ax_ratio.set_title(f"R = {test.ratio:.3g} [{test.ratio_low:.3g}, {test.ratio_high:.3g}]", fontsize=10)
    ax_drop.set_title(f"D = {100 * test.drop:.2f} [{100 * test.drop_low:.2f}, {100 * test.drop_high:.2f}] points",
                      fontsize=10)


def interpolation_plot(ax_loss: plt.Axes, ax_acc: plt.Axes | None, table: pd.DataFrame,
                       a_label: str = "small batch", b_label: str = "large batch") -> None:
    """Keskar et al.'s parametric plot: loss (log scale) and accuracy along alpha for train and test; the
    table may hold several pairs of runs (e.g. one per seed): their mean is drawn, their range as a band.
    alpha 0 = a, alpha 1 = b."""
    for split, style in (("train", "-"), ("test", "--")):
        part = table[table["split"] == split].groupby("alpha")
        for ax, column in ((ax_loss, "loss"), (ax_acc, "accuracy")):
            if ax is None:
                continue
            mean, low, high = part[column].mean(), part[column].min(), part[column].max()
            ax.plot(mean.index, mean.values, style, color="C0" if column == "loss" else "C1", label=split)
            ax.fill_between(mean.index, low.values, high.values, alpha=0.2, color="C0" if column == "loss" else "C1")
    for ax, column in ((ax_loss, "cross-entropy"), (ax_acc, "accuracy")):
        if ax is None:
            continue
        for x, name in ((0, a_label), (1, b_label)):
            ax.axvline(x, color="0.6", linewidth=0.8)
            ax.annotate(name, (x, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                        textcoords="offset points", fontsize=8, color="0.4")
        ax.set(xlabel="alpha", ylabel=column)
        ax.legend(fontsize=8)
    ax_loss.set_yscale("log")
