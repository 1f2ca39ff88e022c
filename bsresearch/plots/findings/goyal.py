"""Figures of Goyal et al. (2017), linear lr scaling with warmup;
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.goyal.

rule_vs_batch, difference_vs_batch (with limits_from_intervals, threshold_axis), curves_by_batch,
ceiling_plot (the lr-ceiling test)

Setting and pre-registered test: docs/protocols.md#goyal.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import matplotlib.transforms as mtransforms
import numpy as np
import pandas as pd

from ...findings.goyal import CeilingTest
from .. import log2_batch_axis
from ..sweeps import (
    axis_label,
    interval_yerr,
    plain_numbers,
    present_in_order,
    variant_colors,
)


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
    shown = table[table[hue].isin(names)]
    seeds = rows[(rows["state"] == "ok") & rows[hue].isin(names)][y]
    limits_from_intervals(ax, [shown[f"{y}_low"], shown[f"{y}_mean"], seeds], [shown[f"{y}_high"], seeds], log_y)
    ax.set(xlabel=axis_label("batch_size"), ylabel=axis_label(y))
    ax.legend(handles=handles, fontsize="small")
    return ax


def limits_from_intervals(ax: plt.Axes, lows: Sequence[Any], highs: Sequence[Any], log: bool = False,
                          pad: float = 0.06) -> None:
    """Set the y limits so every finite value of `lows` and `highs` (interval ends, points) lies inside
    the axes, padded by `pad` of the range (of the log range on a log axis)."""
    lo = np.concatenate([np.asarray(v, dtype=float).ravel() for v in lows])
    hi = np.concatenate([np.asarray(v, dtype=float).ravel() for v in highs])
    values = np.concatenate([lo, hi])
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    if not len(values):
        return
    bottom, top = float(values.min()), float(values.max())
    if log:
        span = math.log10(top / bottom) if top > bottom else 1.0
        ax.set_ylim(bottom / 10 ** (pad * span), top * 10 ** (pad * span))
    else:
        span = top - bottom if top > bottom else max(abs(top), 1e-3)
        ax.set_ylim(bottom - pad * span, top + pad * span)


def threshold_axis(ax: plt.Axes, margin_points: float, color: object, label: str) -> None:
    """A difference axis in points that keeps a -margin threshold readable beside a collapse of tens of
    points: a grey line at 0, the dotted threshold at -margin_points, and a symmetric-log scale, linear within
    2 margins of 0, with plain tick labels. Set the limits after this call (a new scale resets them)."""
    ax.axhline(0.0, color="0.7", linewidth=0.8)
    ax.axhline(-margin_points, color=color, linestyle=":", linewidth=1.2, label=label)
    ax.set_yscale("symlog", linthresh=2 * margin_points, linscale=1.5)
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))


def difference_vs_batch(ax: plt.Axes, rows: pd.DataFrame, diffs: pd.DataFrame, margin: float = 0.01,
                        hue: str = "variant", order: Sequence[str] | None = None,
                        colors: dict[str, tuple] | None = None, baseline_batch: int = 32) -> plt.Axes:
    """Each rule's mean metric minus its own at `baseline_batch` (versus_baseline_batch), in percentage
    points, with Welch's 95% interval, against batch size (log2 axis); one dotted line at -margin, the
    threshold of "holds" (docs/protocols.md#goyal), which applies to every rule because each is measured
    from its own baseline. Diverged seeds: an x at the bottom in the rule's colour. Limits from the
    intervals, so every bar lies inside the axes. The y axis is symmetric-log, linear within 2 margins of 0,
    so that the threshold stays readable beside a collapse of tens of points."""
    names = present_in_order(diffs[hue], order)
    colors = colors or variant_colors(names)
    bottom = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    ends: list[Any] = []
    for i, name in enumerate(names):
        shift = 2 ** (0.04 * (i - (len(names) - 1) / 2))
        part = diffs[(diffs[hue] == name) & diffs["diff"].notna()].sort_values("batch_size")
        y, low, high = 100 * part["diff"], 100 * part["low"], 100 * part["high"]
        err = np.vstack([np.nan_to_num(y - low), np.nan_to_num(high - y)])
        ax.errorbar(part["batch_size"] * shift, y, yerr=err, marker="o", ms=4, capsize=2, color=colors[name],
                    label=name)
        ends += [low, high, y]
        diverged = rows[(rows[hue] == name) & (rows["state"] == "diverged")]
        if len(diverged):
            ax.scatter(diverged["batch_size"] * shift, np.full(len(diverged), 0.03), marker="x", s=30,
                       color=colors[name], transform=bottom, zorder=4, clip_on=False, label=f"_diverged {name}")
    threshold_axis(ax, 100 * margin, "0.3", f"-{100 * margin:g} point: holds above (lower end)")
    limits_from_intervals(ax, ends + [[-100 * margin]], ends + [[0.0]])
    log2_batch_axis(ax, "x", [int(b) for b in diffs["batch_size"].unique()])
    ax.set(xlabel=axis_label("batch_size"), ylabel=f"test acc. - same rule at B={baseline_batch} (points)")
    ax.legend(fontsize="x-small")
    return ax


def curves_by_batch(ax: plt.Axes, history: pd.DataFrame, y: str = "train_loss", x: str = "epoch",
                    hue: str = "batch_size", log_y: bool = True, colors: dict[Any, Any] | None = None,
                    confidence: float = 0.95) -> plt.Axes:
    """`y` against `x` from a long-form history, one line per `hue` value (batch size): the mean over seeds
    at each evaluation and a band of its Student-t interval over seeds (stats.t_interval; no band where
    only one seed is left). `colors`: hue value -> colour (default: viridis by rank)."""
    from ...stats import t_interval
    values = sorted(history[hue].dropna().unique())
    cmap = plt.get_cmap("viridis")
    colors = colors or {v: cmap(i / max(len(values) - 1, 1)) for i, v in enumerate(values)}
    for v in values:
        rows = []
        for at, group in history[history[hue] == v].groupby(x, sort=True):
            mean, _, low, high = t_interval(group[y], confidence)
            rows.append((at, mean, low, high))
        curve = pd.DataFrame(rows, columns=[x, "mean", "low", "high"])
        label = f"{v:g}" if isinstance(v, (int, float, np.number)) else str(v)
        ax.plot(curve[x], curve["mean"], color=colors[v], label=label, linewidth=1.2)
        ax.fill_between(curve[x], curve["low"], curve["high"], color=colors[v], alpha=0.2, linewidth=0)
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y))
    return ax


def ceiling_plot(ax_diff: plt.Axes, ax_lr: plt.Axes, test: CeilingTest, batch: str = "batch_size") -> None:
    """The mechanism test as the eye should read it. Left: test accuracy minus the baseline's (points, Welch 95%
    interval) against batch size, at the linear rule's lr and at each batch size's held-out best lr, with the
    -margin threshold on a symmetric-log axis (linear within 2 margins), and B/N on a top axis. Right: the lrs
    against batch size on log-log axes: the linear rule's, the best of the grid (hollow where it is the
    grid's smallest) and the lr ceiling (the largest lr at which every seed learns)."""
    per = test.per_batch.sort_values(batch)
    b = per[batch].to_numpy(float)
    margin = 100 * test.linear.margin
    for i, (name, label) in enumerate([("linear", "linear rule's lr"), ("best", "held-out best lr of the grid")]):
        if f"{name}_diff" not in per:
            continue
        y, low, high = (100 * per[f"{name}_{c}"].to_numpy(float) for c in ("diff", "low", "high"))
        shift = 2 ** (0.03 * (2 * i - 1))
        ax_diff.errorbar(b * shift, y, yerr=np.vstack([np.nan_to_num(y - low), np.nan_to_num(high - y)]), fmt="o-",
                         ms=4, capsize=2, color=f"C{i}", label=label)
    threshold_axis(ax_diff, margin, "C3", f"-{margin:g} point: holds above")
    log2_batch_axis(ax_diff, "x", [int(v) for v in b])
    ax_diff.set(xlabel=axis_label(batch), ylabel=f"test acc. - B={test.linear.baseline_batch} (points)")
    n = float(test.n_train)
    top = ax_diff.secondary_xaxis("top", functions=(lambda x: np.asarray(x, float) / n,
                                                    lambda f: np.asarray(f, float) * n))
    top.set_xticks(b / n, [f"{v:.2g}" for v in b / n])
    top.xaxis.set_minor_locator(mticker.NullLocator())
    top.set_xlabel("B / N")
    ax_diff.legend(fontsize="x-small")
    base = test.linear.baseline_batch
    base_lr = float(per.loc[per[batch] == base, "linear_lr"].iloc[0]) if (per[batch] == base).any() else math.nan
    ax_lr.plot(b, per["linear_lr"], "--", color="0.5", label=f"linear rule: {base_lr:g} B/{base}")
    bottom = per["best_at_bottom"].astype(bool).to_numpy()
    ax_lr.plot(b[~bottom], per["best_lr"].to_numpy(float)[~bottom], "o", color="C1", label="best lr (all seeds)")
    if bottom.any():
        ax_lr.plot(b[bottom], per["best_lr"].to_numpy(float)[bottom], "o", mfc="white", color="C1",
                   label="best lr, the grid's smallest")
    ax_lr.plot(b, per["lr_ceiling"], "v", color="C3", label="lr ceiling: largest lr at which every seed learns")
    ax_lr.set_yscale("log")
    log2_batch_axis(ax_lr, "x", [int(v) for v in b])
    ax_lr.set(xlabel=axis_label(batch), ylabel="learning rate")
    ax_lr.legend(fontsize="x-small")
