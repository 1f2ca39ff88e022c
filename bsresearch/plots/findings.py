"""Figures for the reproductions the lead maintains (Keskar, Dinh, the noisy quadratic model).
Each draws on a given Axes from a DataFrame; no torch import."""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from . import log2_batch_axis


def steps_by_optimizer(ax: plt.Axes, table: pd.DataFrame, fits: dict[str, Any] | None = None,
                       steps: str = "steps", hue: str = "optimizer") -> plt.Axes:
    """Steps to the target against batch size (log-log), one line per `hue` value, with the perfect-scaling
    slope from each line's smallest batch (dotted) and, given CriticalBatchFits, each B_crit marked."""
    for i, (name, group) in enumerate(table.groupby(hue, sort=False)):
        group = group.sort_values("batch_size")
        color = f"C{i}"
        label = name if not fits or name not in fits else f"{name} (B_crit {fits[name].b_crit:.3g})"
        ax.plot(group["batch_size"], group[steps], "o-", color=color, markersize=3, label=label)
        b0, s0 = group["batch_size"].iloc[0], group[steps].iloc[0]
        ax.plot(group["batch_size"], s0 * b0 / group["batch_size"], ":", color=color, linewidth=0.8)
        if fits and name in fits:
            ax.axvline(fits[name].b_crit, color=color, linestyle="--", linewidth=0.8, alpha=0.7)
    log2_batch_axis(ax, "x", [int(b) for b in table["batch_size"].unique()][::2])
    ax.set_yscale("log")
    ax.set(xlabel="batch size", ylabel="steps to target")
    ax.legend(fontsize=8)
    return ax


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


def reparameterisation_plot(ax: plt.Axes, table: pd.DataFrame, measures: dict[str, str]) -> plt.Axes:
    """Each measure relative to its value at alpha = 1, against the rescaling alpha (log-log)."""
    base = table.set_index("alpha").loc[1.0]
    for column, label in measures.items():
        ax.plot(table["alpha"], table[column] / base[column], "o-", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    ax.set(xlabel="rescaling alpha (layer k x alpha, layer k+1 / alpha)", ylabel="value / value at alpha = 1")
    ax.legend(fontsize=8)
    return ax
