"""Figures of small batches for language models (Marek et al. 2025);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.lm_small_batch.

loss_vs_batch, spread_vs_batch

Setting and pre-registered test: docs/protocols.md#lm-small-batch.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ...findings.lm_small_batch import SETTINGS
from .. import interval_err, log2_batch_axis
from ..sweeps import axis_label


def loss_vs_batch(ax: plt.Axes, table: pd.DataFrame, metric: str = "test_loss", unit: str | None = None) -> plt.Axes:
    """Final `metric` against the batch size, one line per setting (mean over seeds with its t interval)."""
    for i, setting in enumerate(s for s in [*SETTINGS, *sorted(set(table["setting"]) - set(SETTINGS))]
                                if s in set(table["setting"])):
        g = table[table["setting"] == setting].sort_values("batch_size")
        mean = g[f"{metric}_mean"].to_numpy(float)
        yerr = interval_err(mean, g[f"{metric}_low"], g[f"{metric}_high"])
        ax.errorbar(g["batch_size"], mean, yerr=yerr, fmt="o-" if "accumulated" not in setting else "D",
                    color=f"C{i}", capsize=3, label=setting.replace("_", " "))
    log2_batch_axis(ax, "x", sorted(int(b) for b in table["batch_size"].unique()))
    ax.set(xlabel="batch size (sequences)", ylabel=axis_label(metric, unit))
    ax.legend(fontsize=7)
    return ax


def spread_vs_batch(ax: plt.Axes, selection: pd.DataFrame) -> plt.Axes:
    """Robustness: the spread of the selection seeds' mean loss over each cell's lr grid, against the batch."""
    for i, setting in enumerate(s for s in SETTINGS if s in set(selection["setting"])):
        g = selection[selection["setting"] == setting].sort_values("batch_size")
        ax.plot(g["batch_size"], g["spread"], "o-", color=f"C{i}", label=setting.replace("_", " "))
    log2_batch_axis(ax, "x", sorted(int(b) for b in selection["batch_size"].unique()))
    ax.set(xlabel="batch size (sequences)", ylabel="loss spread over the lr grid (max - min)")
    ax.legend(fontsize=7)
    return ax
