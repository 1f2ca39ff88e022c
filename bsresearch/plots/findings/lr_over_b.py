"""Figure of the lr/B test (protocol v5): the difference from each diagonal's reference lr against lr."""
from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes

from ...findings.lr_over_b import EquivalenceTest


def difference_vs_lr(ax: Axes, test: EquivalenceTest) -> None:
    """Per diagonal, test accuracy minus that at its reference lr (Welch interval, points) against lr, the
    +-1 point band; a cell that stops training is marked x at 0."""
    cells = test.cells
    for ratio, g in cells.groupby("lr_over_b", sort=True):
        g = g.sort_values("lr")
        ok = g[g["status"] != "stops"]
        y = 100 * ok["diff"]
        err = [(y - 100 * ok["low"]).fillna(0), (100 * ok["high"] - y).fillna(0)]
        line = ax.errorbar(ok["lr"], y, yerr=err, marker="o", capsize=3, label=f"lr/B = 1/{1 / ratio:.0f}")
        stops = g[g["status"] == "stops"]
        ax.plot(stops["lr"], [0] * len(stops), "x", color=line[0].get_color())
    ax.axhspan(-1, 1, color="grey", alpha=0.2)
    ax.set(xscale="log", xlabel="lr", ylabel="test accuracy - reference lr's (points)",
           title=f"lr/B alone? {test.verdict}")
    ax.legend(fontsize=7)


def accuracy_vs_lr_over_b(ax: Axes, table: pd.DataFrame) -> None:
    """Secondary: test accuracy at the common train loss (mean and 95% t interval over the seeds that reached it:
    findings.lr_over_b.accuracy_table) against lr/B, one line per lr."""
    for lr, g in table.groupby("lr", sort=True):
        g = g.sort_values("lr_over_b")
        y = 100 * g["mean"]
        err = [(y - 100 * g["low"]).fillna(0), (100 * g["high"] - y).fillna(0)]
        ax.errorbar(g["lr_over_b"], y, yerr=err, marker="o", capsize=3, label=f"lr {lr:g}")
    ax.set(xscale="log", xlabel="lr / B", ylabel="test accuracy (%)")
    ax.legend(fontsize=7)
