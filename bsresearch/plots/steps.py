"""Figures for steps to a target against batch size (Shallue et al. 2019; McCandlish et al. 2018).

Each function draws on the Axes it is given, from the tables of bsresearch.steps_to_target, and returns
the Axes. Batch-size axes are base-2 log; steps, examples, lrs and noise scales are on log axes.
No torch import.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..measure.critical import CriticalBatchFit
from ..steps_to_target import MAXIMAL_EXPONENT, PERFECT_EXPONENT, REGIMES, LrFit, regime_boundaries
from . import log2_batch_axis

REGIME_COLORS = ("#d8ecd8", "#f6efd2", "#f3d9d9")  # perfect scaling, diminishing returns, maximal parallelism


def _batch_span(batch_sizes: np.ndarray) -> np.ndarray:
    return np.geomspace(batch_sizes.min() / 1.5, batch_sizes.max() * 1.5, 200)


def mark_regimes(ax: plt.Axes, b_crit: float, perfect: float = PERFECT_EXPONENT, maximal: float = MAXIMAL_EXPONENT,
                 labels: bool = True) -> plt.Axes:
    """Shade the three regimes of the fitted curve S_min (1 + B_crit/B) behind the data: perfect scaling
    below the batch size where its scaling exponent is `perfect`, maximal data parallelism above the one
    where it is `maximal`, diminishing returns between. Call after the data are drawn (uses the x limits)."""
    low, high = regime_boundaries(b_crit, perfect, maximal)
    left, right = ax.get_xlim()
    spans = [(left, low), (low, high), (high, right)]
    for (a, b), color, name in zip(spans, REGIME_COLORS, REGIMES):
        a, b = max(a, left), min(b, right)
        if b <= a:
            continue
        ax.axvspan(a, b, color=color, zorder=0, linewidth=0)
        if labels:
            ax.text(np.sqrt(a * b), 0.98, name.replace(" ", "\n", 1), transform=ax.get_xaxis_transform(),
                    ha="center", va="top", fontsize=7, color="0.35")
    ax.set_xlim(left, right)
    return ax


def _draw_measured(ax: plt.Axes, per_seed: pd.DataFrame, table: pd.DataFrame, column: str, per_seed_column: str,
                   spread: str) -> None:
    """Each seed as a faint point, and the mean over seeds with error bars: +- one standard deviation over
    seeds (spread "std") or the Student-t interval of the mean (spread "interval", tuned_table's _low/_high)."""
    if spread not in ("std", "interval"):
        raise ValueError(f"spread must be 'std' or 'interval'; got {spread!r}")
    data = per_seed.dropna(subset=[per_seed_column])
    ax.scatter(data["batch_size"], data[per_seed_column], s=12, color="0.3", alpha=0.45, zorder=3, linewidths=0,
               label="each seed")
    mean = table[f"{column}_mean"].to_numpy(float)
    if spread == "std":
        std = np.nan_to_num(table[f"{column}_std"].to_numpy(float))
        low, high = mean - std, mean + std
    else:
        low, high = table[f"{column}_low"].to_numpy(float), table[f"{column}_high"].to_numpy(float)
    low = np.where(np.isfinite(low) & (low > 0), low, mean)   # a log axis cannot show a bar below 0
    high = np.where(np.isfinite(high), high, mean)
    label = "mean over seeds +- std" if spread == "std" else "mean over seeds, t-interval"
    ax.errorbar(table["batch_size"], mean, yerr=np.vstack([mean - low, high - mean]), fmt="o", color="C0",
                capsize=3, zorder=4, label=label)


def steps_vs_batch(ax: plt.Axes, per_seed: pd.DataFrame, table: pd.DataFrame, fit: CriticalBatchFit | None = None,
                   regimes: bool = True, steps: str = "steps_to_target", perfect: float = PERFECT_EXPONENT,
                   maximal: float = MAXIMAL_EXPONENT, spread: str = "std") -> plt.Axes:
    """Steps to the target at the tuned lr against batch size: each seed (grey), the mean over seeds with
    error bars (`spread`: +- std, or the t-interval of tuned_table's steps_low/high), the fit
    S_min (1 + B_crit/B), B_crit (dotted line) with its interval (a bar along the bottom) and, with regimes,
    the three regimes of the fitted curve shaded (split where its scaling exponent is `perfect` and
    `maximal`, see mark_regimes)."""
    curve = None if fit is None else (
        fit.predict_steps, fit.s_min, f"S_min (1 + B_crit/B): S_min {fit.s_min:.3g}, B_crit {fit.b_crit:.3g}")
    _to_target_vs_batch(ax, per_seed, table, fit, "steps", steps, curve, regimes, perfect, maximal, spread)
    ax.legend(fontsize=7, loc="best")
    return ax


def examples_vs_batch(ax: plt.Axes, per_seed: pd.DataFrame, table: pd.DataFrame, fit: CriticalBatchFit | None = None,
                      regimes: bool = True, examples: str = "examples_to_target", perfect: float = PERFECT_EXPONENT,
                      maximal: float = MAXIMAL_EXPONENT, spread: str = "std") -> plt.Axes:
    """Examples to the target (E = S x B) at the tuned lr against batch size, with E_min (1 + B/B_crit);
    the same marks as steps_vs_batch."""
    curve = None if fit is None else (
        fit.predict_examples, fit.e_min, f"E_min (1 + B/B_crit): E_min {fit.e_min:.3g}, B_crit {fit.b_crit:.3g}")
    _to_target_vs_batch(ax, per_seed, table, fit, "examples", examples, curve, regimes, perfect, maximal, spread)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 0.9))  # E rises with B; below the regime names
    return ax


def _to_target_vs_batch(ax: plt.Axes, per_seed: pd.DataFrame, table: pd.DataFrame, fit: CriticalBatchFit | None,
                        kind: str, column: str, curve, regimes: bool, perfect: float, maximal: float,
                        spread: str) -> None:
    """What steps_vs_batch and examples_vs_batch share; `curve` is (predict, floor, label) of the fit."""
    _draw_measured(ax, per_seed, table, kind, column, spread)
    sizes = table["batch_size"].to_numpy(float)
    if fit is not None:
        predict, floor, label = curve
        b = _batch_span(sizes)
        ax.plot(b, predict(b), "-", color="0.2", zorder=2, label=label)
        ax.axhline(floor, color="0.5", linestyle="--", linewidth=0.8, zorder=1)
        _mark_b_crit(ax, fit)
    log2_batch_axis(ax, "x", [int(v) for v in sizes])
    ax.set_yscale("log")
    if fit is not None and regimes:
        mark_regimes(ax, fit.b_crit, perfect, maximal)
    ax.set(xlabel="batch size (examples per update)", ylabel=f"{kind} to target")


def _mark_b_crit(ax: plt.Axes, fit: CriticalBatchFit) -> None:
    """B_crit as a dotted vertical line, its interval as a thick bar along the bottom of the axes."""
    ax.axvline(fit.b_crit, color="0.3", linestyle=":", linewidth=1, zorder=2)
    low, high = fit.b_crit_interval
    if np.isfinite(low) and np.isfinite(high):
        ax.plot([low, high], [0.02, 0.02], transform=ax.get_xaxis_transform(), color="0.3", linewidth=4,
                solid_capstyle="butt", zorder=5, label=f"B_crit {fit.confidence:.0%} interval")


def tuned_lr_vs_batch(ax: plt.Axes, table: pd.DataFrame, runs: pd.DataFrame | None = None,
                      lr_fit: LrFit | None = None) -> plt.Axes:
    """The best lr per batch size (filled: interior to the lrs tried; open: on the grid's edge), every lr
    tried as a small grey tick (from `runs`), and the fit eps_max / (1 + B_lr/B) if given."""
    if runs is not None:
        tried = runs[["batch_size", "lr"]].drop_duplicates()
        ax.scatter(tried["batch_size"], tried["lr"], marker="_", s=60, color="0.5", zorder=2, label="lrs tried")
    interior = table["interior"].astype(bool).to_numpy()
    b, lr = table["batch_size"].to_numpy(float), table["lr"].to_numpy(float)
    ax.plot(b, lr, "-", color="C1", linewidth=0.8, zorder=3)
    if interior.any():
        ax.scatter(b[interior], lr[interior], color="C1", zorder=4, label="best lr (interior)")
    if (~interior).any():
        ax.scatter(b[~interior], lr[~interior], facecolors="white", edgecolors="C1", zorder=4,
                   label="best lr (grid edge)")
    if lr_fit is not None:
        grid = _batch_span(b)
        ax.plot(grid, lr_fit.predict(grid), "--", color="0.3", zorder=2,
                label=f"eps_max/(1 + B_lr/B): eps_max {lr_fit.eps_max:.2g}, B_lr {lr_fit.b_lr:.3g}")
    log2_batch_axis(ax, "x", [int(v) for v in b])
    ax.set_yscale("log", base=2)
    ax.set(xlabel="batch size (examples per update)", ylabel="learning rate")
    ax.legend(fontsize=7, loc="lower right")
    return ax


def steps_vs_lr(ax: plt.Axes, runs: pd.DataFrame, steps: str = "steps_to_target", cap: str = "max_steps"
                ) -> plt.Axes:
    """Steps to the target against the lr, one line per batch size (mean over seeds that reached it);
    an lr at which some seed never reached the target (diverged or hit its cap) is drawn as an x at the
    batch size's cap."""
    cmap = plt.get_cmap("viridis")
    sizes = sorted(runs["batch_size"].unique())
    for i, b in enumerate(sizes):
        color = cmap(i / max(1, len(sizes) - 1))
        group = runs[runs["batch_size"] == b]
        per_lr = group.groupby("lr")[steps].agg(lambda s: pd.to_numeric(s, errors="coerce").mean(skipna=False))
        reached = per_lr.dropna()
        ax.plot(reached.index, reached.to_numpy(), "o-", color=color, markersize=3, label=f"{int(b)}")
        failed = per_lr[per_lr.isna()].index
        if len(failed):
            ax.scatter(failed, [group[cap].max()] * len(failed), marker="x", color=color, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(xlabel="learning rate", ylabel="steps to target")
    ax.legend(title="batch size", fontsize=6, title_fontsize=7, ncols=2)
    return ax


def noise_vs_training(ax: plt.Axes, noise: pd.DataFrame, fit: CriticalBatchFit | None = None, x: str = "step",
                      target_loss: float | None = None, b_noise: bool = True) -> plt.Axes:
    """B_simple (and B_noise with its Hutchinson standard error) at the checkpoints of a run (noise_checkpoints)
    against `x` ("step" or "train_loss"), one line per seed in training order (seeds differ by line style);
    B_crit from the fit as a dashed line with its interval as a grey band. Values <= 0 (B_noise where
    G^T H G < 0, i.e. negative curvature along the gradient, or a Hutchinson estimate below 0) have no
    meaning as a noise scale and are not drawn. With x = train_loss the axis runs from high loss to low
    (training order), and target_loss is marked."""
    data = noise[noise[x] > 0] if x == "step" else noise
    series = [("b_simple", "B_simple", "C0", "o")]
    if b_noise and "b_noise" in data and data["b_noise"].notna().any():
        series.append(("b_noise", "B_noise", "C3", "s"))
    styles = ("-", "--", ":", "-.")
    for i, (seed, run) in enumerate(data.sort_values("step").groupby("seed", sort=True)):
        for column, name, color, marker in series:
            drawn = run[run[column] > 0]
            ax.plot(drawn[x], drawn[column], marker=marker, linestyle=styles[i % len(styles)], color=color,
                    markersize=3, linewidth=1, label=f"{name}, seed {seed:g}", zorder=3)
            if column == "b_noise" and "b_noise_std_error" in drawn:
                ax.errorbar(drawn[x], drawn[column], yerr=np.minimum(drawn["b_noise_std_error"], 0.95 * drawn[column]),
                            fmt="none", color=color, capsize=2, linewidth=0.8, zorder=3)
    if fit is not None:
        _b_crit_band(ax, fit)
    ax.set_yscale("log")
    ax.set_xscale("log")
    if x == "step":
        ax.set_xlabel("step (updates)")
    else:
        ax.invert_xaxis()
        ax.set_xlabel("full-train loss (decreasing: training order)")
    if target_loss is not None and x == "train_loss":
        ax.axvline(target_loss, color="0.4", linestyle=":", linewidth=1, label=f"target {target_loss:g}")
    ax.set_ylabel("noise scale (examples)")
    ax.legend(fontsize=6, ncols=2)
    return ax


def noise_at_target_vs_batch(ax: plt.Axes, table: pd.DataFrame, fit: CriticalBatchFit | None = None,
                             value: str = "b_simple") -> plt.Axes:
    """A noise scale measured at the weights where each run reached the target (a row per run: batch_size,
    `value`) against batch size: each run as a point and the geometric mean per batch size as a line (the
    ratio fluctuates over orders of magnitude with |G|^2); B_crit and its interval as in noise_vs_training."""
    data = table[table[value] > 0]
    ax.scatter(data["batch_size"], data[value], s=14, color="C0", alpha=0.6, zorder=3, linewidths=0,
               label="each run (best lr, each seed)")
    geo = data.groupby("batch_size")[value].apply(lambda v: float(np.exp(np.log(v).mean())))
    ax.plot(geo.index, geo.to_numpy(), "-", color="C0", zorder=3, label="geometric mean over seeds")
    if fit is not None:
        _b_crit_band(ax, fit)
    log2_batch_axis(ax, "x", [int(v) for v in geo.index])
    ax.set(yscale="log", xlabel="batch size (examples per update)",
           ylabel=f"{value.replace('b_', 'B_')} at the target (examples)")
    ax.legend(fontsize=6)
    return ax


def _b_crit_band(ax: plt.Axes, fit: CriticalBatchFit) -> None:
    ax.axhline(fit.b_crit, color="0.2", linestyle="--", linewidth=1, label=f"B_crit from S(B): {fit.b_crit:.3g}")
    low, high = fit.b_crit_interval
    if np.isfinite(low) and np.isfinite(high):
        ax.axhspan(low, high, color="0.5", alpha=0.2, linewidth=0, label=f"B_crit {fit.confidence:.0%} interval")


def regime_legend_text(perfect: float = PERFECT_EXPONENT, maximal: float = MAXIMAL_EXPONENT) -> str:
    """One sentence for a caption: how the shaded regimes are defined."""
    return (f"Shading: the regimes of the fitted curve, split where its scaling exponent -dlogS/dlogB = "
            f"B_crit/(B + B_crit) is {perfect:g} (B = B_crit/{perfect / (1 - perfect):g}) and {maximal:g} "
            f"(B = {(1 - maximal) / maximal:g} B_crit): perfect scaling (green), diminishing returns (yellow), "
            f"maximal data parallelism (red).")


__all__ = ["mark_regimes", "steps_vs_batch", "examples_vs_batch", "tuned_lr_vs_batch", "steps_vs_lr",
           "noise_vs_training", "noise_at_target_vs_batch", "regime_legend_text"]
