"""Sweep figures: each function draws on the Axes it is given, from a bsresearch.results table, and returns it.

Means are over seeds with the interval the protocol states (docs/protocols.md, Statistics conventions item
1): the 95% Student t interval over seeds, computed by stats.t_interval, the same numbers as the summary
tables (stats.summarize); seaborn draws it but never bootstraps it. The individual seeds are drawn as faint
points so a reader sees how many there are. Batch-size axes are base-2 log.
seaborn is imported by the functions that use it (it takes a second or more to import, and the run
template, executed once per run, only needs `run_curves`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from . import log2_batch_axis


def t_interval_over_seeds(values: Any) -> tuple[float, float]:
    """(low, high) of the 95% Student t interval of the mean of `values`: seaborn's `errorbar` for every sweep
    figure, so a figure's interval is the table's (stats.summarize); NaN (no bar) with fewer than 2 values."""
    from ..stats import t_interval
    _, _, low, high = t_interval(list(values))
    return low, high


CI = t_interval_over_seeds
LABELS = {"batch_size": "batch size (examples per update)", "lr": "learning rate", "step": "step (updates)",
          "examples": "examples seen", "epoch": "epoch", "train_loss": "train loss", "test_loss": "test loss",
          "train_acc": "train accuracy", "test_acc": "test accuracy", "gap_acc": "train - test accuracy",
          "gap_loss": "test - train loss",
          "steps_to_target": "steps to target", "examples_to_target": "examples to target"}


def axis_label(name: str, unit: str | None = None) -> str:
    """A column's axis label; a loss with its unit (config.json's loss_unit, e.g. 'nats per token')."""
    if name.startswith("keskar_phi_eps"):  # measure.registry's names, e.g. keskar_phi_eps1e-3
        return f"Keskar sharpness phi (%), eps {name.removeprefix('keskar_phi_eps')}"
    label = LABELS.get(name, name.replace("_", " "))
    return f"{label} ({unit})" if unit and name.endswith("_loss") else label


def plain_numbers(ax: plt.Axes) -> None:
    """No '+1' offset on a linear y axis (accuracies near 1 otherwise read as 0.0000)."""
    formatter = ax.yaxis.get_major_formatter()
    if hasattr(formatter, "set_useOffset"):
        formatter.set_useOffset(False)


def categorical(data: pd.DataFrame, column: str | None) -> tuple[pd.DataFrame, list[str] | None]:
    """A numeric hue as ordered text labels (seaborn would otherwise use a continuous colour scale)."""
    if column is None:
        return data, None
    order = sorted(data[column].dropna().unique())
    labels = {v: f"{v:g}" if isinstance(v, (int, float, np.number)) else str(v) for v in order}
    return data.assign(**{column: data[column].map(labels)}), [labels[v] for v in order]


def metric_vs_batch(ax: plt.Axes, runs: pd.DataFrame, y: str = "test_acc", hue: str | None = None,
                    errorbar: Any = CI, seeds: bool = True, unit: str | None = None, **kwargs: Any) -> plt.Axes:
    """Mean of `y` over seeds against batch size (log2 axis), with a 95% interval; one line per `hue`; a loss
    labelled with its `unit`."""
    import seaborn as sns
    data, order = categorical(runs.dropna(subset=[y]), hue)
    sns.lineplot(data=data, x="batch_size", y=y, hue=hue, hue_order=order, errorbar=errorbar, marker="o",
                 err_style="bars", seed=0, ax=ax, **kwargs)
    if seeds:
        ax.scatter(data["batch_size"], data[y], s=10, color="0.3", alpha=0.35, zorder=3, linewidths=0)
    log2_batch_axis(ax, "x", [int(b) for b in runs["batch_size"].unique()])
    plain_numbers(ax)
    ax.set(xlabel=axis_label("batch_size"), ylabel=axis_label(y, unit))
    return ax


def metric_vs_lr(ax: plt.Axes, runs: pd.DataFrame, y: str, hue: str | None = "batch_size",
                 errorbar: Any = CI, **kwargs: Any) -> plt.Axes:
    """Mean of `y` over seeds against the learning rate (log axis), one line per `hue` (batch size)."""
    import seaborn as sns
    data, order = categorical(runs.dropna(subset=[y]), hue)
    sns.lineplot(data=data, x="lr", y=y, hue=hue, hue_order=order, errorbar=errorbar, marker="o",
                 err_style="bars", seed=0, ax=ax, **kwargs)
    ax.set_xscale("log")
    ax.set(xlabel=axis_label("lr"), ylabel=axis_label(y))
    return ax


def learning_curves(ax: plt.Axes, history: pd.DataFrame, y: str = "train_loss", x: str = "step",
                    hue: str | None = "batch_size", errorbar: Any = CI, log_x: bool = True, log_y: bool = True,
                    unit: str | None = None, **kwargs: Any) -> plt.Axes:
    """`y` against `x` from a long-form history (results.load_history), mean over seeds with a 95%
    interval, one line per `hue`; a loss labelled with its `unit`. Step 0 is left out of a log x axis."""
    import seaborn as sns
    data = history[history[x] > 0] if log_x else history
    data, order = categorical(data, hue)
    sns.lineplot(data=data, x=x, y=y, hue=hue, hue_order=order, errorbar=errorbar, seed=0, ax=ax, **kwargs)
    if log_x:
        ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y, unit))
    return ax


def run_curves(ax_loss: plt.Axes, ax_acc: plt.Axes, history: pd.DataFrame, x: str = "step",
               loss_unit: str = "nats") -> None:
    """One run's train and test loss (log-log, its unit in the label: config.json's loss_unit) and, on the
    second axes, its accuracy; for a run without accuracy, its bits per character or byte when it has them
    (a language model), else that axes says why it is empty."""
    data = history[history[x] > 0]
    second = next((c.removeprefix("test_") for c in data.columns
                   if c == "test_acc" or c.startswith("test_bits_per_")), None)
    for split, style in (("train", "-"), ("test", "--")):
        ax_loss.plot(data[x], data[f"{split}_loss"], style, label=split)
        if second:
            ax_acc.plot(data[x], data[f"{split}_{second}"], style, label=split)
    label = "loss (mean cross-entropy)" if loss_unit == "nats" else f"loss ({loss_unit})"
    ax_loss.set(xscale="log", yscale="log", xlabel=axis_label(x), ylabel=label)
    ax_loss.legend()
    if second:
        ax_acc.set(xscale="log", xlabel=axis_label(x), ylabel="accuracy" if second == "acc" else
                   second.replace("_", " "))
        ax_acc.legend()
    else:
        ax_acc.text(0.5, 0.5, "no accuracy: the targets are not class labels", ha="center", va="center",
                    transform=ax_acc.transAxes, fontsize=9, color="0.4")
        ax_acc.set_axis_off()


def steps_to_target_plot(ax: plt.Axes, table: pd.DataFrame, steps: str = "steps_to_target",
                         fit: Any | None = None, label: str | None = None) -> plt.Axes:
    """Steps to the target against batch size (log2 x, log y): each row a point (e.g. best lr per batch
    size, or every seed), and, given a CriticalBatchFit, the curve S_min (1 + B_crit/B) and B_crit."""
    data = table.dropna(subset=[steps])
    ax.plot(data["batch_size"], data[steps], "o", label=label or "measured")
    if fit is not None:
        b = np.geomspace(data["batch_size"].min() / 2, data["batch_size"].max() * 2, 200)
        ax.plot(b, fit.predict_steps(b), "-", color="0.3",
                label=f"S_min (1 + B_crit/B): B_crit = {fit.b_crit:.3g}, S_min = {fit.s_min:.3g}")
        ax.axvline(fit.b_crit, color="0.6", linestyle=":", linewidth=1)
    log2_batch_axis(ax, "x", [int(v) for v in data["batch_size"].unique()])
    ax.set_yscale("log")
    ax.set(xlabel=axis_label("batch_size"), ylabel=axis_label(steps))
    ax.legend()
    return ax


PAGE_WIDTH = 10.0   # inches: the widest figure_grid, about a notebook cell at 100 dpi and a landscape page


def figure_grid(n: int, width: float = 4.0, height: float = 3.2, ncols: int | None = None
                ) -> tuple[plt.Figure, Sequence[plt.Axes]]:
    """n Axes of `width` x `height` inches each, in rows of `ncols` (default: up to 3; four as 2 x 2), scaled
    down together so that the figure is at most PAGE_WIDTH wide; constrained layout."""
    ncols = ncols or (n if n <= 3 else 2 if n == 4 else 3)
    nrows = -(-n // ncols)
    scale = min(1.0, PAGE_WIDTH / (width * ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols * scale, height * nrows * scale),
                             layout="constrained", squeeze=False)
    for unused in axes.flat[n:]:
        unused.remove()
    return fig, list(axes.flat)[:n]


def variant_colors(names: Sequence[str]) -> dict[str, tuple]:
    """A fixed colour per variant (tab10 in the given order), to keep one colour per variant across the
    figures of a report; also usable as seaborn's `palette`."""
    palette = plt.get_cmap("tab10")
    return {name: palette(i % 10) for i, name in enumerate(names)}


def present_in_order(values: pd.Series, order: Sequence[str] | None) -> list[str]:
    present = list(dict.fromkeys(values.dropna()))
    return [v for v in order if v in present] if order is not None else present


def interval_yerr(table: pd.DataFrame, y: str) -> np.ndarray:
    """Asymmetric error bars from the t-interval columns; 0 where an interval is undefined (one seed)."""
    mean = table[f"{y}_mean"].to_numpy(float)
    low = np.nan_to_num(mean - table[f"{y}_low"].to_numpy(float))
    high = np.nan_to_num(table[f"{y}_high"].to_numpy(float) - mean)
    return np.vstack([low, high])

