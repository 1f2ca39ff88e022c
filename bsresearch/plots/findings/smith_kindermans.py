"""Figures of Smith, Kindermans, Ying & Le (2018), grow the batch instead of decaying the lr;
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.smith_kindermans.

curves_by_schedule

Setting and pre-registered test: docs/protocols.md#smith-kindermans.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ..sweeps import axis_label


def curves_by_schedule(ax: plt.Axes, history: pd.DataFrame, y: str = "test_acc", x: str = "epoch",
                       variant: str = "variant") -> plt.Axes:
    """Mean `y` over seeds against `x` (epochs or steps), one line per schedule, the range over seeds shaded."""
    for i, (name, group) in enumerate(history.groupby(variant, sort=True)):
        curve = group.groupby(x)[y].agg(["mean", "min", "max"]).reset_index()
        ax.plot(curve[x], curve["mean"], color=f"C{i}", label=str(name))
        ax.fill_between(curve[x], curve["min"], curve["max"], color=f"C{i}", alpha=0.2, lw=0)
    if x == "step":
        ax.set_xscale("log")
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y))
    ax.legend(fontsize="small")
    return ax
