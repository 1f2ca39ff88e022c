"""Figures of batch-size warmup (Merrill et al. 2025);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.lm_batch_warmup.

loss_vs: the loss curves against tokens or steps

Setting and pre-registered test: docs/protocols.md#lm-batch-warmup.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ..sweeps import axis_label


def loss_vs(ax: plt.Axes, curves: pd.DataFrame, x: str = "tokens", metric: str = "test_loss",
            unit: str | None = None) -> plt.Axes:
    """`metric` against tokens or steps, each run thin, per schedule."""
    for i, schedule in enumerate(s for s in ("small", "warmup", "large") if s in set(curves["schedule"])):
        for j, (_, g) in enumerate(curves[curves["schedule"] == schedule].groupby("run_id")):
            ax.plot(g[x], g[metric], color=f"C{i}", alpha=0.6, linewidth=1, label=schedule if j == 0 else None)
    ax.set_xscale("log")
    ax.set(xlabel="tokens trained" if x == "tokens" else "optimizer steps", ylabel=axis_label(metric, unit))
    ax.legend(fontsize=7)
    return ax
