"""Figures of Dinh et al. (2017), sharpness under ReLU rescaling;
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.dinh.

measure_vs_alpha: a measure's absolute value against the rescaling alpha

Setting and pre-registered test: docs/protocols.md#dinh.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter


def measure_vs_alpha(ax: plt.Axes, table: pd.DataFrame, measure: str, by: str = "batch_size",
                     colors: dict | None = None, log_y: bool | None = None, reference_alpha: float = 1.0,
                     invariant_below: float = 0.01, title: str | None = None) -> plt.Axes:
    """One measure's absolute value against the rescaling alpha (log x), one colour per `by` value (batch
    size): each model thin, the mean over models thick. The title's second line gives the largest relative
    change from alpha = 1 over every model and alpha; below `invariant_below` it says "unchanged", so
    measures that do not move read as such rather than as curves on top of each other. log_y: default
    when the values are positive and span more than a factor 10."""
    values = sorted(table[by].unique())
    colors = colors or {v: f"C{i}" for i, v in enumerate(values)}
    for v in values:
        part = table[table[by] == v]
        for _, run in part.groupby("seed", sort=True):
            run = run.sort_values("alpha")
            ax.plot(run["alpha"], run[measure], color=colors[v], linewidth=0.6, alpha=0.4)
        mean = part.groupby("alpha", as_index=False)[measure].mean()
        ax.plot(mean["alpha"], mean[measure], "o-", ms=3, color=colors[v], linewidth=1.6,
                label=f"batch {v:g} (mean of {part['seed'].nunique()})")
    ref = table[np.isclose(table["alpha"], reference_alpha)][[by, "seed", measure]]
    both = table[[by, "seed", measure]].merge(ref, on=[by, "seed"], suffixes=("", "_ref"))
    change = float((both[measure] / both[f"{measure}_ref"] - 1).abs().max())
    note = (f"unchanged: max |x/x(1) - 1| = {change:.1g}" if change < invariant_below
            else f"max |x/x(1) - 1| = {change:.3g}")
    ax.set_title(f"{title or measure}\n{note}", fontsize="small")
    ax.set_xscale("log")
    positive = bool((table[measure] > 0).all())
    if log_y is None:
        log_y = positive and float(table[measure].max() / table[measure].min()) > 10
    if log_y and positive:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="alpha")
    return ax
