"""Figures of the noisy quadratic model (Zhang et al. 2019);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.nqm.

steps_by_optimizer, critical_batch_vs_power

Setting and pre-registered test: docs/protocols.md#nqm.
"""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from .. import interval_err, log2_batch_axis


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


def critical_batch_vs_power(ax: plt.Axes, table: pd.DataFrame) -> plt.Axes:
    """B_crit (log scale) against the preconditioning power p, with and without momentum, each point with
    its 95% fit interval as an error bar."""
    for i, (momentum, group) in enumerate(table.groupby("momentum", sort=True)):
        group = group.sort_values("power")
        b = group["b_crit"].to_numpy(float)
        err = interval_err(b, group["b_crit_low"], group["b_crit_high"])
        ax.errorbar(group["power"], b, yerr=err, fmt="o-", capsize=3, color=f"C{i}",
                    label="momentum tuned in {0, 0.5, 0.9, 0.99}" if momentum else "no momentum")
    ax.set_yscale("log")
    ax.set(xlabel="preconditioning power p (P = H^-p)", ylabel="critical batch size B_crit")
    ax.set_xticks(sorted(table["power"].unique()))
    ax.legend(fontsize=8)
    return ax
