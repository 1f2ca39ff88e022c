"""Sweep figures: each function draws on the Axes it is given, from a bsresearch.results table, and returns it.

Means are over seeds with the interval the protocol states (docs/protocols.md, Statistics conventions item
1): the 95% Student t interval over seeds, computed by stats.t_interval, the same numbers as the summary
tables (stats.summarize); seaborn draws it but never bootstraps it. The individual seeds are drawn as faint
points so a reader sees how many there are. Batch-size axes are base-2 log.

Two cases where that interval is not drawn as computed, each said by the figure's caption:
- an accuracy lies in [0, 1], and with 2 seeds its t interval can reach past 1 (t = 12.7): `bounded` clips it
  to [0, 1] (BOUNDED_METRICS);
- on a log y axis an interval whose lower end is at or below 0 runs off the axis: `geometric=True` draws the
  geometric mean over seeds and the t interval of the logs instead, which stays positive.
Labels name the quantity and its unit (LABELS, axis_label); a hue's legend title too.
seaborn is imported by the functions that use it (it takes a second or more to import, and the run
template, executed once per run, only needs `run_curves`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from . import log2_batch_axis


def t_interval_over_seeds(values: Any) -> tuple[float, float]:
    """(low, high) of the 95% Student t interval of the mean of `values`: seaborn's `errorbar` for every sweep
    figure, so a figure's interval is the table's (stats.summarize); NaN (no bar) with fewer than 2 values."""
    from ..stats import t_interval
    _, _, low, high = t_interval(list(values))
    return low, high


def bounded(interval: Any = t_interval_over_seeds, low: float = 0.0, high: float = 1.0) -> Any:
    """An errorbar function: `interval` clipped to [low, high] (an accuracy's t interval over 2 seeds can
    reach 1.55); a figure that uses it says so in its caption."""
    def clipped(values: Any) -> tuple[float, float]:
        a, b = interval(values)
        mean = float(np.mean(values))   # never clipped past the mean (values outside [low, high] are not accuracies)
        return min(float(np.clip(a, low, high)), mean), max(float(np.clip(b, low, high)), mean)
    return clipped


def log_t_interval(values: Any) -> tuple[float, float]:
    """The 95% t interval of the mean of log(values), back on the values' scale: positive, so it stays on a log
    axis; the positive values only (a log axis shows no others)."""
    logs = np.log([v for v in values if v > 0])
    low, high = t_interval_over_seeds(logs)
    return float(np.exp(low)), float(np.exp(high))


def geometric_mean(values: Any) -> float:
    """exp(mean(log(values))) over the positive values (the estimator that goes with log_t_interval)."""
    positive = [v for v in values if v > 0]
    return float(np.exp(np.mean(np.log(positive)))) if positive else float("nan")


CI = t_interval_over_seeds
BOUNDED_METRICS = ("train_acc", "test_acc", "accuracy", "eval_accuracy", "test_accuracy", "train_accuracy")
LABELS = {"batch_size": "batch size (examples per update)", "lr": "learning rate", "learning_rate": "learning rate",
          "step": "step (updates)", "examples": "examples seen", "tokens": "tokens seen", "epoch": "epoch",
          "seed": "seed",
          "train_loss": "train loss", "test_loss": "test loss", "eval_loss": "evaluation loss", "loss": "train loss",
          "train_acc": "train accuracy", "test_acc": "test accuracy", "accuracy": "accuracy",
          "eval_accuracy": "evaluation accuracy", "gap_acc": "train - test accuracy", "gap_loss": "test - train loss",
          "steps_to_target": "steps to target (updates)", "examples_to_target": "examples to target",
          "noise_b_simple": "B_simple, gradient noise scale (examples)",
          "noise_b_noise": "B_noise, gradient noise scale (examples)",
          "b_simple": "B_simple, gradient noise scale (examples)",
          "b_simple_ema": "B_simple, moving average (examples)",
          "hessian_top_eigenvalue": "top Hessian eigenvalue (loss per parameter²)",
          "hessian_trace": "Hessian trace (loss per parameter²)",
          "sharpness": "sharpness: top Hessian eigenvalue (loss per parameter²)",
          "sharpness_limit": "stability limit of the sharpness (loss per parameter²)",
          "preconditioned_sharpness": "preconditioned sharpness (1 / learning rate)",
          "batch_sharpness": "batch sharpness (loss per parameter²)",
          "batch_sharpness_pooled": "batch sharpness, ratio of means (loss per parameter²)",
          "train_seconds": "training time (s)"}


NOISE_SCALES = ("noise_b_simple", "noise_b_noise", "b_simple", "b_simple_ema")   # labelled "(examples)" by default


def axis_label(name: str, unit: str | None = None) -> str:
    """A column's axis label, with its unit: a loss with the runs' (config.json's loss_unit, e.g. 'nats per
    token'); a measurement with its own (LABELS)."""
    if name.startswith("keskar_phi_eps"):  # bsresearch.measurements' names, e.g. keskar_phi_eps1e-3
        return f"Keskar sharpness phi (%), eps {name.removeprefix('keskar_phi_eps')}"
    if name.startswith("m_sharpness_"):
        return f"m-sharpness, {name.removeprefix('m_sharpness_').replace('_', ' ')} (loss)"
    if name.startswith("sharpness_") and name not in LABELS:
        return f"sharpness, {name.removeprefix('sharpness_').replace('_', ' ')} (loss)"
    label = LABELS.get(name, name.replace("_", " "))
    if unit and name in NOISE_SCALES:   # a noise scale in the runs' unit (tokens, for a token-level loss)
        return label.replace("(examples)", f"({unit})")
    return f"{label} ({unit})" if unit and name.endswith("loss") else label


def label_legend(ax: plt.Axes, hue: str | None) -> None:
    """The legend's title as the hue's label ('batch size (examples per update)', not 'batch_size')."""
    legend = ax.get_legend()
    if legend is not None and hue is not None:
        legend.set_title(axis_label(hue))


def interval_for(y: str, errorbar: Any, geometric: bool) -> tuple[Any, Any]:
    """(estimator, errorbar) for a metric: the geometric mean and log_t_interval on a log axis; an
    accuracy's interval clipped to [0, 1]."""
    if errorbar is CI and geometric:
        return geometric_mean, log_t_interval
    if errorbar is CI and y in BOUNDED_METRICS:
        return "mean", bounded(CI)
    return "mean", errorbar


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


def mean_with_bars(ax: plt.Axes, runs: pd.DataFrame, x: str, y: str, hue: str | None, errorbar: Any, log_y: bool,
                   **kwargs: Any) -> pd.DataFrame:
    """One line per `hue` of `y`'s mean over seeds against `x`, marked, its interval as bars (log_y: the geometric
    mean, positive values only); the rows drawn are returned."""
    import seaborn as sns
    data = runs.dropna(subset=[y])
    data = data[data[y] > 0] if log_y else data
    data, order = categorical(data, hue)
    estimator, errorbar = interval_for(y, errorbar, log_y)
    sns.lineplot(data=data, x=x, y=y, hue=hue, hue_order=order, estimator=estimator, errorbar=errorbar, marker="o",
                 err_style="bars", seed=0, ax=ax, **kwargs)
    return data


def metric_vs_batch(ax: plt.Axes, runs: pd.DataFrame, y: str = "test_acc", hue: str | None = None,
                    errorbar: Any = CI, seeds: bool = True, unit: str | None = None, x: str = "batch_size",
                    log_y: bool = False, **kwargs: Any) -> plt.Axes:
    """Mean of `y` over seeds against batch size (`x`, log2 axis), with a 95% interval (an accuracy's clipped to
    [0, 1]); one line per `hue`; a loss labelled with its `unit`. log_y: a log y axis, the geometric mean
    and the t interval of the logs (positive values only)."""
    data = mean_with_bars(ax, runs, x, y, hue, errorbar, log_y, **kwargs)
    if seeds:
        ax.scatter(data[x], data[y], s=10, color="0.3", alpha=0.35, zorder=3, linewidths=0)
    log2_batch_axis(ax, "x", [int(b) for b in runs[x].unique()])
    if log_y:
        ax.set_yscale("log")
    else:
        plain_numbers(ax)
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y, unit))
    label_legend(ax, hue)
    return ax


def metric_vs_lr(ax: plt.Axes, runs: pd.DataFrame, y: str, hue: str | None = "batch_size",
                 errorbar: Any = CI, x: str = "lr", log_y: bool = False, unit: str | None = None,
                 **kwargs: Any) -> plt.Axes:
    """Mean of `y` over seeds against the learning rate (`x`, log axis), one line per `hue` (batch size); log_y
    as metric_vs_batch's."""
    mean_with_bars(ax, runs, x, y, hue, errorbar, log_y, **kwargs)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y, unit))
    label_legend(ax, hue)
    return ax


def learning_curves(ax: plt.Axes, history: pd.DataFrame, y: str = "train_loss", x: str = "step",
                    hue: str | None = "batch_size", errorbar: Any = CI, log_x: bool = True, log_y: bool = True,
                    unit: str | None = None, geometric: bool = False, **kwargs: Any) -> plt.Axes:
    """`y` against `x` from a long-form history (results.load_history), mean over seeds with a 95%
    interval (an accuracy's clipped to [0, 1]), one line per `hue`; a loss labelled with its `unit`. Step 0 is
    left out of a log x axis. geometric (with log_y): the geometric mean and the t interval of the logs, so
    that the band stays on the log axis."""
    import seaborn as sns
    data = history[history[x] > 0] if log_x else history
    data = data.dropna(subset=[y])
    data = data[data[y] > 0] if log_y and geometric else data
    data, order = categorical(data, hue)
    estimator, errorbar = interval_for(y, errorbar, log_y and geometric)
    sns.lineplot(data=data, x=x, y=y, hue=hue, hue_order=order, estimator=estimator, errorbar=errorbar, seed=0, ax=ax,
                 **kwargs)
    label_legend(ax, hue)
    if log_x:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())   # over less than a decade the minor labels run together
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

