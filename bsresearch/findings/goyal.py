"""Goyal et al. (2017), "Accurate, Large Minibatch SGD": linear lr scaling with gradual warmup keeps
accuracy up to a breaking batch size. Analysis and figures; no torch import.

    table = stats.summarize_states(rows, ["variant", "batch_size"], ["test_acc"])  # rows: sweep.runs_per_variant
    verdict = breaking_batch(table, "test_acc", drop=0.01)    # where each rule breaks
    versus_baseline_batch(rows, "test_acc", 32)               # each rule at each batch minus itself at 32 (Welch)
    rule_vs_batch(ax, rows, table)                            # the figure

A "rule" is a spec variant (lr scaling rule and warmup); a run diverged when its state is "diverged".
Setting and pre-registered test: docs/protocols.md#goyal.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import matplotlib.transforms as mtransforms
import numpy as np
import pandas as pd

from ..config import ConfigError
from ..plots import log2_batch_axis
from ..plots.sweeps import (
    axis_label,
    interval_yerr,
    plain_numbers,
    present_in_order,
    variant_colors,
)
from ..stats import versus_within


def breaking_batch(table: pd.DataFrame, metric: str = "test_acc", drop: float = 0.01, rule: str = "variant",
                   batch: str = "batch_size", baseline_batch: int | None = None) -> pd.DataFrame:
    """Where each rule breaks, from a summarize_states table by (rule, batch size).

    The baseline is the rule's mean `metric` at `baseline_batch` (default: its smallest batch size). A
    batch size is broken when a seed diverged, or the mean over the seeds that finished lies more than
    `drop` below the baseline (a higher-is-better metric, e.g. test accuracy, in the metric's units).
    One row per rule: baseline, largest_ok (the largest batch size below the first broken one; every
    batch size when none broke), first_broken (NaN if none), why (text), and the batch sizes broken.
    """
    mean = f"{metric}_mean"
    if mean not in table or "n_diverged" not in table:
        raise ConfigError(f"breaking_batch needs a summarize_states table with {mean!r} and n_diverged; "
                          f"got columns {list(table.columns)}")
    out = []
    for name, group in table.groupby(rule, sort=False):
        group = group.sort_values(batch)
        base_b = group[batch].iloc[0] if baseline_batch is None else baseline_batch
        base_rows = group[group[batch] == base_b]
        baseline = float(base_rows[mean].iloc[0]) if len(base_rows) else math.nan
        broken, reasons = [], {}
        for _, row in group.iterrows():
            b = row[batch]
            if row["n_diverged"] > 0:
                reasons[b] = f"{int(row['n_diverged'])} of {int(row['n_runs'])} seeds diverged"
            elif math.isfinite(baseline) and row[mean] < baseline - drop:
                reasons[b] = f"{metric} {row[mean]:.4f} < baseline {baseline:.4f} - {drop:g}"
            if b in reasons:
                broken.append(b)
        first = broken[0] if broken else math.nan
        below = group[group[batch] < first][batch] if broken else group[batch]
        out.append({rule: name, "baseline_batch": base_b, "baseline": baseline,
                    "largest_ok": below.max() if len(below) else math.nan, "first_broken": first,
                    "why": reasons.get(first, ""), "broken": tuple(broken)})
    return pd.DataFrame(out)


def versus_baseline_batch(rows: pd.DataFrame, metric: str, baseline_batch: int, rule: str = "variant",
                          batch: str = "batch_size", confidence: float = 0.95) -> pd.DataFrame:
    """Per (rule, batch size): mean `metric` minus the same rule's at `baseline_batch`, with Welch's
    interval over seeds (runs with state "ok"). Columns: rule, batch, diff, low, high, n, n_reference."""
    return versus_within(rows, metric, rule, batch, baseline_batch, confidence)


# ----------------------------------------------------------------------------- figures
def rule_vs_batch(ax: plt.Axes, rows: pd.DataFrame, table: pd.DataFrame, y: str = "test_acc",
                  hue: str = "variant", order: Sequence[str] | None = None, log_y: bool = False,
                  colors: dict[str, tuple] | None = None) -> plt.Axes:
    """Mean `y` over seeds against batch size (log2 axis), one line per rule (`hue`), with t-intervals.

    `rows`: one row per run and rule (sweep.runs_per_variant), for the seeds (state ok) and the
    diverged runs (an x at the bottom, in the rule's colour); `table`: stats.summarize_states by
    (hue, batch_size) with `y` among its metrics. The x positions are offset slightly per rule so the
    bars do not hide each other. `colors`: hue value -> colour (default: variant_colors of the order).
    """
    names = present_in_order(table[hue], order)
    colors = colors or variant_colors(names)
    bottom = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    handles: list[Any] = []
    for i, name in enumerate(names):
        shift = 2 ** (0.04 * (i - (len(names) - 1) / 2))  # a few percent along the log2 axis
        part = table[(table[hue] == name) & (table["n"] > 0)].sort_values("batch_size")
        if len(part):
            handles.append(ax.errorbar(part["batch_size"] * shift, part[f"{y}_mean"], yerr=interval_yerr(part, y),
                                       marker="o", ms=4, capsize=2, color=colors[name], label=name))
        mine = rows[rows[hue] == name]
        ok = mine[mine["state"] == "ok"]
        ax.scatter(ok["batch_size"] * shift, ok[y], s=8, color=colors[name], alpha=0.35, linewidths=0, zorder=3)
        diverged = mine[mine["state"] == "diverged"]
        if len(diverged):
            ax.scatter(diverged["batch_size"] * shift, np.full(len(diverged), 0.03), marker="x", s=30,
                       color=colors[name], transform=bottom, zorder=4, clip_on=False, label=f"_diverged {name}")
    if (rows["state"] == "diverged").any():
        handles.append(ax.scatter([], [], marker="x", color="0.3", label="diverged (one x per seed)"))
    log2_batch_axis(ax, "x", [int(b) for b in table["batch_size"].unique()])
    if log_y:
        ax.set_yscale("log")
    else:
        plain_numbers(ax)
    ax.set(xlabel=axis_label("batch_size"), ylabel=axis_label(y))
    ax.legend(handles=handles, fontsize="small")
    return ax
