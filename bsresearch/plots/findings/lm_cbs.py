"""Figures of a language model's critical batch size by branching (Merrill et al. 2025);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.lm_cbs.

cbs_vs_tokens, ratio_vs_k

Setting and pre-registered test: docs/protocols.md#lm-cbs.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ...findings.lm_cbs import EPS, STALL_BEATEN, STALL_IMPROVEMENT
from .. import interval_err, log2_batch_axis


def cbs_vs_tokens(ax: plt.Axes, table: pd.DataFrame, cbs: pd.DataFrame, unit: str = "sequences") -> plt.Axes:
    """The CBS (each seed, grey; geometric mean with its interval, blue) and B_simple (mean with its
    interval, orange) against the tokens trained at the checkpoint, both in examples per batch (`unit`)."""
    jitter = 1 + 0.04 * (cbs["seed"] - cbs["seed"].mean()) / max(1.0, float(cbs["seed"].std(ddof=0) or 1.0))
    ax.scatter(cbs["checkpoint"] * jitter, cbs["cbs"], s=10, color="0.5", alpha=0.6, linewidths=0,
               label="CBS, each seed")
    x = table["checkpoint"].to_numpy(float)
    mean = table["cbs_gmean"].to_numpy(float)
    ax.errorbar(x, mean, yerr=interval_err(mean, table["cbs_low"], table["cbs_high"]), fmt="o-", color="C0",
                capsize=3, label="CBS by branching: geometric mean, t interval")
    if "b_simple_mean" in table:
        b = table["b_simple_mean"].to_numpy(float)
        yerr = interval_err(b, table["b_simple_low"], table["b_simple_high"])
        ax.errorbar(x * 1.03, b, yerr=yerr, fmt="s--", color="C1", capsize=3,
                    label="B_simple (noise scale): mean, t interval")
    ax.set_xscale("log")
    log2_batch_axis(ax, "y")
    ax.set(xlabel="tokens trained at the checkpoint", ylabel=f"batch size ({unit})")
    ax.legend(fontsize=7)
    return ax


def ratio_vs_k(ax: plt.Axes, ratios: pd.DataFrame, eps: float = EPS) -> plt.Axes:
    """L_k / L_1 against k, one line per checkpoint (mean over seeds, its t interval as bars: loss_ratios'
    `ratio_low` and `ratio_high`), and the tolerance 1 + eps."""
    for i, (checkpoint, g) in enumerate(ratios.groupby("checkpoint", sort=True)):
        mean = g["ratio_mean"].to_numpy(float)
        yerr = interval_err(mean, g["ratio_low"], g["ratio_high"])
        colour = plt.cm.viridis(i / max(1, ratios["checkpoint"].nunique() - 1))
        ax.errorbar(g["k"], mean, yerr=yerr, fmt="o-", capsize=3, color=colour, label=f"{checkpoint:,.0f} tokens")
    ax.axhline(1 + eps, color="0.3", linestyle="--", linewidth=0.8, label=f"tolerance 1 + {eps:g}")
    log2_batch_axis(ax, "x")
    ax.set(xlabel="k (branch batch / original batch)", ylabel="loss after the window / loss at k = 1")
    ax.legend(fontsize=7)
    return ax


def stall_vs_tokens(axes: tuple[plt.Axes, plt.Axes], per_seed: pd.DataFrame, stalls: pd.DataFrame,
                    reference: str = "L(T0)") -> None:
    """The stall criterion of protocol v5 against the tokens at each checkpoint, each seed and the mean over seeds
    (what the criterion reads): left, the reference's improvement over its window against its 2% floor; right,
    the smallest L_k / L_1 over k >= 2 against its 0.995 floor. A stalled checkpoint's mean is drawn in red.
    `reference`: the loss at the checkpoint the improvement is judged against, as the y label names it (protocol v6:
    the cooldown's L_cool(T0)). Only measured values are drawn (a partial sweep may lack the runs a column needs);
    a panel with none says so."""
    for ax, column, floor, label in ((axes[0], "improvement", STALL_IMPROVEMENT, f"1 - L_1(T0 + W) / {reference}"),
                                     (axes[1], "min_ratio", 1 - STALL_BEATEN, "min over k >= 2 of L_k / L_1")):
        seeds, means = per_seed[per_seed[column].notna()], stalls[stalls[column].notna()]
        ax.set(xlabel="tokens at the checkpoint", ylabel=label)
        if seeds.empty and means.empty:
            ax.text(0.5, 0.5, "not measured yet", transform=ax.transAxes, ha="center", va="center")
        else:
            ax.plot(seeds["checkpoint"], seeds[column], ".", color="0.6", label="each seed")
            colours = np.where(means["stalled"].astype(bool), "tab:red", "tab:blue")
            ax.scatter(means["checkpoint"], means[column], c=colours, s=40, zorder=3, label="mean (red: stalled)")
            ax.set_xscale("log")
        ax.axhline(floor, color="k", ls="--", lw=1, label=f"floor {floor:g}")
        ax.legend(fontsize=7)
