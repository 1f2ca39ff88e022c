"""Figures for the large-batch recipes (Hoffer et al., Goyal et al.): drawn on a given Axes from the tables
of bsresearch.recipes and bsresearch.results, returning the Axes. No torch import.

Intervals are the Student-t 95% intervals of the mean over seeds from results.summarize (the numbers in
the report's tables), not seaborn's bootstrap; the seeds themselves are drawn as faint points. Runs that
diverged are marked with an x at the bottom of the axis (their final numbers are not meaningful).
"""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import matplotlib.transforms as mtransforms
import numpy as np
import pandas as pd

from . import log2_batch_axis
from .sweeps import _label, _plain_numbers


def variant_colors(names: Sequence[str]) -> dict[str, tuple]:
    """A fixed colour per variant (tab10 in the given order), to keep one colour per variant across the
    figures of a report; also usable as seaborn's `palette`."""
    palette = plt.get_cmap("tab10")
    return {name: palette(i % 10) for i, name in enumerate(names)}


def _order(values: pd.Series, order: Sequence[str] | None) -> list[str]:
    present = list(dict.fromkeys(values.dropna()))
    return [v for v in order if v in present] if order is not None else present


def _yerr(table: pd.DataFrame, y: str) -> np.ndarray:
    """Asymmetric error bars from the t-interval columns; 0 where an interval is undefined (one seed)."""
    mean = table[f"{y}_mean"].to_numpy(float)
    low = np.nan_to_num(mean - table[f"{y}_low"].to_numpy(float))
    high = np.nan_to_num(table[f"{y}_high"].to_numpy(float) - mean)
    return np.vstack([low, high])


def rule_vs_batch(ax: plt.Axes, rows: pd.DataFrame, table: pd.DataFrame, y: str = "test_acc",
                  hue: str = "variant", order: Sequence[str] | None = None, log_y: bool = False,
                  colors: dict[str, tuple] | None = None) -> plt.Axes:
    """Mean `y` over seeds against batch size (log2 axis), one line per rule (`hue`), with t-intervals.

    `rows`: one row per run and rule (recipes.runs_per_variant), for the seeds (state ok) and the
    diverged runs (an x at the bottom, in the rule's colour); `table`: recipes.summarize_states by
    (hue, batch_size) with `y` among its metrics. The x positions are offset slightly per rule so the
    bars do not hide each other. `colors`: hue value -> colour (default: variant_colors of the order).
    """
    names = _order(table[hue], order)
    colors = colors or variant_colors(names)
    bottom = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    handles = []
    for i, name in enumerate(names):
        shift = 2 ** (0.04 * (i - (len(names) - 1) / 2))  # a few percent along the log2 axis
        part = table[(table[hue] == name) & (table["n"] > 0)].sort_values("batch_size")
        if len(part):
            handles.append(ax.errorbar(part["batch_size"] * shift, part[f"{y}_mean"], yerr=_yerr(part, y),
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
        _plain_numbers(ax)
    ax.set(xlabel=_label("batch_size"), ylabel=_label(y))
    ax.legend(handles=handles, fontsize="small")
    return ax


def variant_points(ax: plt.Axes, rows: pd.DataFrame, table: pd.DataFrame, y: str = "test_acc",
                   by: str = "variant", order: Sequence[str] | None = None) -> plt.Axes:
    """One row of the y axis per variant: the mean of `y` over seeds with its t-interval, seeds as dots.

    `rows`: one row per run (state ok are drawn); `table`: recipes.summarize_states (or results.summarize)
    by `by`. Variants are listed top to bottom in `order` (default: the table's order).
    """
    names = _order(table[by], order)
    positions = {name: len(names) - 1 - i for i, name in enumerate(names)}
    part = table.set_index(by).loc[names].reset_index()
    ax.errorbar(part[f"{y}_mean"], [positions[n] for n in names], xerr=_yerr(part, y), fmt="o", capsize=3,
                color="C0", label="mean, 95% t-interval")
    ok = rows[(rows["state"] == "ok") & rows[by].isin(names)]
    jitter = np.linspace(-0.12, 0.12, 5)
    ax.scatter(ok[y], [positions[n] + jitter[i % 5] for i, n in enumerate(ok[by])], s=10, color="0.3",
               alpha=0.45, linewidths=0, label="seeds")
    ax.set_yticks(list(positions.values()), list(positions.keys()))
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set(xlabel=_label(y))
    ax.grid(axis="x", alpha=0.3)
    return ax


def distance_vs_steps(ax: plt.Axes, history: pd.DataFrame, fits: pd.DataFrame | None = None,
                      hue: str = "variant", order: Sequence[str] | None = None, x: str = "step",
                      colors: dict[str, tuple] | None = None) -> plt.Axes:
    """Distance from initialisation against steps on a log x axis (so d = a + b ln t is a straight line).

    `history`: long form (results.load_history with the `hue` column); the line is the mean over seeds
    at each evaluated step, the band the range over seeds. `fits` (recipes.distance_fits, one row per run
    with `hue`): the log model with the seeds' mean slope and intercept is drawn dashed over the fitted
    range, its mean R^2 in the legend. `colors`: hue value -> colour (default: variant_colors of the order).
    """
    names = _order(history[hue], order)
    colors = colors or variant_colors(names)
    for name in names:
        curve = (history[(history[hue] == name) & (history[x] > 0)]
                 .groupby(x)["distance_from_init"].agg(["mean", "min", "max"]).reset_index())
        label = name
        if fits is not None and (fits[hue] == name).any():
            mine = fits[fits[hue] == name].dropna(subset=["slope"])
            if len(mine):
                t = np.geomspace(mine["t_min"].min(), mine["t_max"].max(), 50)
                ax.plot(t, mine["intercept"].mean() + mine["slope"].mean() * np.log(t), "--", color=colors[name],
                        linewidth=1)
                label = f"{name} (log fit R$^2$ {mine['r2'].mean():.3f})"
        ax.plot(curve[x], curve["mean"], color=colors[name], label=label)
        ax.fill_between(curve[x], curve["min"], curve["max"], color=colors[name], alpha=0.15, linewidth=0)
    ax.set_xscale("log")
    ax.set(xlabel=_label(x), ylabel="distance from initialisation |w - w0|")
    ax.legend(fontsize="small")
    return ax
