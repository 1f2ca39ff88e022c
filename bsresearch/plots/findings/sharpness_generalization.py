"""Figures of sharpness against generalization (Jiang et al. 2020; Andriushchenko et al. 2023);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.sharpness_generalization.

correlation_plot, gap_scatter

Setting and pre-registered test: docs/protocols.md#sharpness-generalization.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from .. import interval_err
from ..sweeps import axis_label


def correlation_plot(ax: plt.Axes, table: pd.DataFrame) -> plt.Axes:
    """Kendall tau with its bootstrap interval per measure (rows), one marker per scope; 0 marked."""
    measures = list(dict.fromkeys(table["measure"]))
    scopes = list(dict.fromkeys(table["scope"]))
    for j, scope in enumerate(scopes):
        part = table[table["scope"] == scope].set_index("measure").reindex(measures)
        y = np.arange(len(measures)) + (j - (len(scopes) - 1) / 2) * 0.22
        err = interval_err(part["tau"], part["low"], part["high"])
        ax.errorbar(part["tau"], y, xerr=err, fmt="o", ms=4, capsize=2, label=scope)
    ax.axvline(0, color="0.5", lw=0.8)
    ax.set_yticks(np.arange(len(measures)), measures)
    ax.invert_yaxis()
    ax.set(xlabel="Kendall tau with the generalization gap", xlim=(-1, 1))
    ax.legend(fontsize="small")
    return ax


def gap_scatter(ax: plt.Axes, runs: pd.DataFrame, measure: str, gap: str = "gap_loss", hue: str = "batch_size",
                style: str = "lr", legend: bool = True) -> plt.Axes:
    """The gap against one measure, one point per run: colour by `hue` (batch size), marker by `style` (lr).
    A measure that is positive and spans more than a factor 10 gets a log x axis."""
    data = runs[[measure, gap, hue, style]].apply(pd.to_numeric, errors="coerce").dropna()
    markers = "osD^vP*X"
    hues, styles = sorted(data[hue].unique()), sorted(data[style].unique())
    for i, h in enumerate(hues):
        for j, v in enumerate(styles):
            part = data[(data[hue] == h) & (data[style] == v)]
            ax.plot(part[measure], part[gap], markers[j % len(markers)], color=f"C{i}", ms=4, alpha=0.8, ls="none")
    x = data[measure].to_numpy(float)
    if len(x) and x.min() > 0 and x.max() > 10 * x.min():
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    handles = [plt.Line2D([], [], marker="o", color=f"C{i}", ls="none", ms=4, label=f"B = {h:g}")
               for i, h in enumerate(hues)]
    handles += [plt.Line2D([], [], marker=markers[j % len(markers)], color="0.3", ls="none", ms=4,
                           label=f"{style} = {v:g}") for j, v in enumerate(styles)]
    if legend:
        ax.legend(handles=handles, fontsize="x-small")
    ax.set(xlabel=axis_label(measure), ylabel=axis_label(gap))
    return ax
