"""Figures of test accuracy against the ghost batch size (Hoffer, Hubara & Soudry 2017);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.ghost_batch.

accuracy_vs_ghost: a metric against the ghost size, each seed and the mean with its interval

Setting and pre-registered test: docs/protocols.md#ghost-batch.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...findings.ghost_batch import ghost_sizes, with_gap
from .. import log2_batch_axis
from ..sweeps import axis_label


def accuracy_vs_ghost(ax: plt.Axes, rows: pd.DataFrame, table: pd.DataFrame, metric: str = "test_acc") -> plt.Axes:
    """`metric` (a column of by_ghost_size's table: test_acc, train_loss, gap_loss, ...) against the ghost
    size (log2 axis; whole-batch BatchNorm at x = the batch size, marked "none"): each run (grey), the mean
    over seeds with its t interval, and the whole-batch mean as a dashed line."""
    data = with_gap(rows.assign(ghost=ghost_sizes(rows)), (metric,))
    data = data[data["state"] == "ok"]
    ax.scatter(data["ghost"], data[metric], s=10, color="0.4", alpha=0.5, linewidths=0, label="each seed")
    mean = table[f"{metric}_mean"].to_numpy(float)
    low = np.nan_to_num(mean - table[f"{metric}_low"].to_numpy(float))
    high = np.nan_to_num(table[f"{metric}_high"].to_numpy(float) - mean)
    ax.errorbar(table["ghost"], mean, yerr=np.vstack([low, high]), fmt="o-", color="C0", capsize=3,
                label="mean over seeds, t-interval")
    batch = float(table["ghost"].max())
    ax.axhline(float(table.loc[table["ghost"] == batch, f"{metric}_mean"].iloc[0]), color="0.4", linestyle="--",
               linewidth=0.8, label="whole-batch BatchNorm (none)")
    sizes = [int(v) for v in table["ghost"]]
    log2_batch_axis(ax, "x", sizes)
    ax.set_xticks(sizes, [str(s) if s < batch else f"{s}\n(none)" for s in sizes])
    ax.set(xlabel="ghost batch size (examples per BatchNorm statistic)", ylabel=axis_label(metric))
    ax.legend(fontsize=7)
    return ax
