"""Figures of the edge-of-stochastic-stability test (protocol v6, findings.eoss): the settled curvature against
the batch size, and the curvature along training, each as a fraction of its stability limit."""
from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes

from ...findings.eoss import BAND, EossTest


def settled_vs_batch(ax: Axes, test: EossTest) -> None:
    """SGD at eta: the settled batch sharpness and lambda_max over 2/eta (mean and 95% t interval over seeds)
    against B, the limit (1) and P1's band; and Adam's preconditioned sharpness over 38/lr."""
    table = test.per_batch
    for arm, column, label, marker in (("sgd", "batch_limit_ratio", "SGD: batch sharpness", "o"),
                                       ("sgd", "limit_ratio", "SGD: lambda_max (full batch)", "s"),
                                       ("adam", "precond_limit_ratio", "Adam: lambda_max(P^-1 H) / (38/lr)", "^")):
        g = table[(table["arm"] == arm) & table["counted"]].sort_values("batch_size") if len(table) else table
        if g.empty or g[column].isna().all():
            continue
        err = [(g[column] - g[f"{column}_low"]).fillna(0), (g[f"{column}_high"] - g[column]).fillna(0)]
        ax.errorbar(g["batch_size"], g[column], yerr=err, marker=marker, capsize=3, label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhspan(*BAND, color="grey", alpha=0.2)
    ax.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="settled value / its stability limit",
           title=f"edge of stochastic stability (eta {test.eta:g}): {test.verdict}")
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7)


def along_training(ax: Axes, history: pd.DataFrame, runs: pd.DataFrame, eta: float, column: str) -> None:
    """The SGD runs at eta: `column` x eta / 2 along training (mean over seeds), one line per batch size (an empty
    panel that says so where the runs did not record `column`)."""
    sgd = runs[(runs["optimizer"] == "sgd") & (runs["lr"].astype(float) == eta)][["run_id", "batch_size"]]
    if column not in history:
        ax.text(0.5, 0.5, f"{column}: not recorded by these runs", ha="center", va="center", transform=ax.transAxes)
        ax.set(title=column)
        return
    h = history.merge(sgd, on="run_id", suffixes=("_h", ""))
    h = h[h[column].notna() & (h["step"] > 0)]
    for batch, g in h.groupby("batch_size", sort=True):
        mean = g.groupby("step")[column].mean() * eta / 2
        ax.plot(mean.index, mean.to_numpy(), label=f"B = {int(batch)}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="step", ylabel=f"{column} / (2 / eta)", title=column)
    ax.legend(fontsize=6, ncol=2)
