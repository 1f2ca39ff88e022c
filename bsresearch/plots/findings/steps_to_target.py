"""Figures of steps to a target against batch size (Shallue et al. 2019; McCandlish et al. 2018);
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.steps_to_target.

mark_regimes (with regime_legend_text for the caption), steps_vs_batch, examples_vs_batch,
tuned_lr_vs_batch, steps_vs_lr, noise_vs_training, noise_at_target_vs_batch, b_crit_vs_target,
two_batch_vs_exact

Setting and pre-registered test: docs/protocols.md#steps-to-target.
"""
from __future__ import annotations

import matplotlib
import matplotlib.patches
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
import pandas as pd

from ...findings.steps_to_target import MAXIMAL_EXPONENT, PERFECT_EXPONENT, REGIMES, LrFit, regime_boundaries
from ...measure.critical import CriticalBatchFit
from .. import log2_batch_axis

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
    label = "mean over seeds +- std" if spread == "std" else "mean over seeds, t interval"
    ax.errorbar(table["batch_size"], mean, yerr=np.vstack([mean - low, high - mean]), fmt="o", color="C0",
                capsize=3, zorder=4, label=label)


def steps_vs_batch(ax: plt.Axes, per_seed: pd.DataFrame, table: pd.DataFrame, fit: CriticalBatchFit | None = None,
                   regimes: bool = True, steps: str = "steps_to_target", perfect: float = PERFECT_EXPONENT,
                   maximal: float = MAXIMAL_EXPONENT, spread: str = "interval") -> plt.Axes:
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
                      maximal: float = MAXIMAL_EXPONENT, spread: str = "interval") -> plt.Axes:
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


def steps_vs_lr(ax: plt.Axes, runs: pd.DataFrame, steps: str = "steps_to_target") -> plt.Axes:
    """Steps to the target against the lr, one line per batch size (mean over seeds that reached it),
    coloured by batch size on a log colour bar. An lr at which some seed never reached the target is not a
    number of steps: it is drawn in a strip along the top edge of the axes, an x where a seed diverged and a
    triangle where a seed hit its step cap (neither is stacked at the cap)."""
    cmap = plt.get_cmap("viridis")
    sizes = sorted(runs["batch_size"].unique())
    norm = matplotlib.colors.LogNorm(vmin=min(sizes), vmax=max(sizes) if max(sizes) > min(sizes) else min(sizes) * 2)
    edge = ax.get_xaxis_transform()        # x in data, y in axes fractions
    marked = set()
    for b in sizes:
        color = cmap(norm(b))
        group = runs[runs["batch_size"] == b].assign(_steps=lambda d: pd.to_numeric(d[steps], errors="coerce"))
        per_lr = group.groupby("lr")["_steps"].agg(lambda v: v.mean(skipna=False))
        reached = per_lr.dropna()
        ax.plot(reached.index, reached.to_numpy(), "o-", color=color, markersize=3, linewidth=1)
        for lr_value in per_lr[per_lr.isna()].index:
            diverged = (group.loc[group["lr"] == lr_value, "state"] == "diverged").any()
            kind = "diverged" if diverged else "capped"
            ax.scatter([lr_value], [0.96 if diverged else 0.91], transform=edge, marker="x" if diverged else "^",
                       color=color, s=22, zorder=3, clip_on=False,
                       label=None if kind in marked else
                       ("a seed diverged (top strip)" if diverged else "a seed hit its step cap (top strip)"))
            marked.add(kind)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * (high / low) ** 0.15)    # room for the strip above the highest mean
    ax.add_patch(matplotlib.patches.Rectangle((0, 0.88), 1, 0.12, transform=ax.transAxes, color="0.92", zorder=0,
                                              linewidth=0))
    ax.set(xlabel="learning rate", ylabel="steps to target (mean over seeds)")
    bar = ax.figure.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.02)
    bar.set_label("batch size (examples per update)")
    if marked:
        ax.legend(fontsize=6, loc="lower left")
    return ax


def noise_vs_training(ax: plt.Axes, noise: pd.DataFrame, fit: CriticalBatchFit | None = None, x: str = "step",
                      target_loss: float | None = None, b_noise: bool = True) -> plt.Axes:
    """B_simple (and B_noise with its Hutchinson standard error) at the checkpoints of a run (noise_checkpoints)
    against `x` ("step" or "train_loss", both on ordinary increasing log axes), one line per seed in training
    order (seeds differ by line style); B_crit from the fit as a dashed line with its interval as a grey band.
    A value <= 0 (B_noise where G^T H G < 0, negative curvature along the gradient, or a Hutchinson estimate
    below 0) cannot sit on a log axis: it is drawn as an open downward triangle on the bottom edge at its x,
    so none is dropped (count them with (noise[column] <= 0).sum() for the caption)."""
    data = noise[noise[x] > 0] if x == "step" else noise
    series = [("b_simple", "B_simple", "C0", "o")]
    if b_noise and "b_noise" in data and data["b_noise"].notna().any():
        series.append(("b_noise", "B_noise", "C3", "s"))
    styles = ("-", "--", ":", "-.")
    edge = ax.get_xaxis_transform()
    for i, (seed, run) in enumerate(data.sort_values("step").groupby("seed", sort=True)):
        for column, name, color, marker in series:
            drawn = run[run[column] > 0]
            ax.plot(drawn[x], drawn[column], marker=marker, linestyle=styles[i % len(styles)], color=color,
                    markersize=3, linewidth=1, label=f"{name}, seed {seed:g}", zorder=3)
            if column == "b_noise" and "b_noise_std_error" in drawn:
                ax.errorbar(drawn[x], drawn[column], yerr=np.minimum(drawn["b_noise_std_error"], 0.95 * drawn[column]),
                            fmt="none", color=color, capsize=2, linewidth=0.8, zorder=3)
            below = run[run[column] <= 0]
            if len(below):
                ax.scatter(below[x], [0.02] * len(below), transform=edge, marker="v", facecolors="white",
                           edgecolors=color, s=25, zorder=5, clip_on=False,
                           label=f"{name} <= 0, seed {seed:g} (bottom edge)")
    if fit is not None:
        _b_crit_band(ax, fit)
    ax.set_yscale("log")
    ax.set_xscale("log")
    ax.set_xlabel("step (updates)" if x == "step" else "full-train loss (training runs right to left)")
    if x == "train_loss" and len(data):       # a short log range: a few plain ticks, no minor labels
        ticks = np.unique([float(f"{v:.2g}") for v in np.geomspace(data[x].min(), data[x].max(), 5)])
        ax.set_xticks(ticks, [f"{v:g}" for v in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
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


def b_crit_vs_target(ax: plt.Axes, table: pd.DataFrame) -> plt.Axes:
    """B_crit against the target loss (b_crit_by_target): the fitted B_crit with its interval as error bars; an
    end the data cannot bound (inf) is drawn as an arrow to the top edge. Both axes log, the loss increasing
    to the right (training moves right to left); annotated with the batch sizes in each fit."""
    data = table.dropna(subset=["b_crit"]).sort_values("target")
    b, low, high = (data[c].to_numpy(float) for c in ("b_crit", "b_crit_low", "b_crit_high"))
    bounded = np.isfinite(high)
    ax.errorbar(data["target"], b, yerr=np.vstack([b - np.where(np.isfinite(low), low, b),
                                                    np.where(bounded, high, b) - b]),
                fmt="o-", color="C0", capsize=3, label="B_crit with its fit interval")
    if (~bounded).any():
        ax.scatter(data["target"][~bounded], [0.97] * int((~bounded).sum()), marker="^", color="C0",
                   transform=ax.get_xaxis_transform(), clip_on=False, label="upper end unbounded")
    for target, n in zip(data["target"], data["n_batch_sizes"]):
        ax.annotate(f"{int(n)} B", (target, 0.03), xycoords=ax.get_xaxis_transform(), ha="center", fontsize=6,
                    color="0.4")
    ax.set(xscale="log", yscale="log", xlabel="target full-train loss (training runs right to left)",
           ylabel="B_crit (examples)")
    ax.set_xticks(data["target"].to_numpy(float), [f"{v:g}" for v in data["target"]])  # a short log range: plain
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.legend(fontsize=6)
    return ax


def two_batch_vs_exact(ax: plt.Axes, table: pd.DataFrame, x: str = "step") -> plt.Axes:
    """The two-batch B_simple (mean over pairs, with its bootstrap interval: columns two_batch, two_batch_low,
    two_batch_high) against the exact per-example B_simple (column exact) at the checkpoints of a run, one
    marker style per seed, both on a log axis against `x`. An interval end at inf is drawn to the top edge."""
    for i, (seed, run) in enumerate(table.sort_values(x).groupby("seed", sort=True)):
        run = run[run[x] > 0]
        ax.plot(run[x], run["exact"], marker="o", color="0.2", markersize=3, linewidth=1,
                label=f"exact (per example), seed {seed:g}", linestyle=("-", "--", ":")[i % 3])
        est, low, high = (run[c].to_numpy(float) for c in ("two_batch", "two_batch_low", "two_batch_high"))
        top = np.nanmax(np.where(np.isfinite(high), high, est)) * 3
        yerr = np.vstack([est - np.where((low > 0) & np.isfinite(low), low, est),
                          np.where(np.isfinite(high), high, top) - est])
        ax.errorbar(run[x], est, yerr=yerr, fmt="s", color=f"C{i}", markersize=3, capsize=2, linewidth=0.8,
                    label=f"two-batch (mean of pairs, bootstrap interval), seed {seed:g}")
    ax.set(xscale="log", yscale="log", xlabel="step (updates)" if x == "step" else x,
           ylabel="B_simple (examples)")
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
