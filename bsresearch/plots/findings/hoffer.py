"""Figures of Hoffer et al. (2017), train longer, generalize better;
each function draws on the Axes it is given, from the tables and tests of bsresearch.findings.hoffer.

variant_label (a variant code spelled out), variant_points, ladder_plot (the mechanism test),
distance_panel (distance from initialisation against log steps)

Setting and pre-registered test: docs/protocols.md#hoffer.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from ...findings.hoffer import (
    FIT_T_MIN,
    MIN_DECADES,
    LogTimeFit,
    MatchedLossRecipeTest,
    _geometric_mean,
    constant_lr_end,
    fit_log_time,
    rung_multiple,
)
from ..sweeps import (
    axis_label,
    interval_yerr,
    present_in_order,
)

BASE_LABELS = {"sb": "SB", "lb": "LB"}


INGREDIENT_LABELS = {"sqrt": "sqrt lr", "gbn": "ghost BN", "ra": "regime adaptation"}


def variant_label(name: str, sep: str = "_") -> str:
    """A readable name for a variant code: "lb_sqrt_gbn_ra" -> "LB + sqrt lr + ghost BN + regime adaptation".
    Unknown parts are kept as they are."""
    base, *ingredients = name.split(sep)
    return " + ".join([BASE_LABELS.get(base, base), *[INGREDIENT_LABELS.get(i, i) for i in ingredients]])


def variant_points(ax: plt.Axes, rows: pd.DataFrame, table: pd.DataFrame, y: str = "test_acc",
                   by: str = "variant", order: Sequence[str] | None = None, labels: bool = True) -> plt.Axes:
    """One row of the y axis per variant: the mean of `y` over seeds with its t-interval, seeds as dots.

    `rows`: one row per run (state ok are drawn); `table`: stats.summarize_states (or stats.summarize)
    by `by`. Variants are listed top to bottom in `order` (default: the table's order); `labels`: tick
    labels by variant_label (else the codes).
    """
    names = present_in_order(table[by], order)
    positions = {name: len(names) - 1 - i for i, name in enumerate(names)}
    part = table.set_index(by).loc[names].reset_index()
    ax.errorbar(part[f"{y}_mean"], [positions[n] for n in names], xerr=interval_yerr(part, y), fmt="o", capsize=3,
                color="C0", label="mean, 95% t-interval")
    ok = rows[(rows["state"] == "ok") & rows[by].isin(names)]
    jitter = np.linspace(-0.12, 0.12, 5)
    ax.scatter(ok[y], [positions[n] + jitter[i % 5] for i, n in enumerate(ok[by])], s=10, color="0.3",
               alpha=0.45, linewidths=0, label="seeds")
    ax.set_yticks(list(positions.values()), [variant_label(n) if labels else n for n in positions])
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set(xlabel=axis_label(y))
    ax.grid(axis="x", alpha=0.3)
    return ax


def ladder_plot(ax: plt.Axes, rows: pd.DataFrame, test: MatchedLossRecipeTest, others: Sequence[str] = ("lb_ra", "lb"),
                metric: str = "test_acc", loss: str = "train_loss", by: str = "variant") -> plt.Axes:
    """The mechanism test as the eye should read it: `metric` against the final `loss` (log axis) of each run
    that ended ok, the small-batch ladder as a line through its rungs' means (geometric mean of the loss, mean
    of the metric) with SB* ringed, the recipe as a red star and `others` (the LB without the recipe) as their
    own markers. If the recipe's star sits on the ladder's line, it generalizes as a small batch that fits the
    training set as well."""
    ok = rows[rows["state"] == "ok"]
    ladder = [name for name in test.ladder[by] if (ok[by] == name).any()]
    means = pd.DataFrame([{by: name, "loss": _geometric_mean(ok.loc[ok[by] == name, loss]),
                           "metric": float(ok.loc[ok[by] == name, metric].mean())} for name in ladder])
    part = ok[ok[by].isin(ladder)]
    ax.scatter(part[loss], part[metric], s=10, color="C0", alpha=0.35, linewidths=0)
    if len(means):
        ax.plot(means["loss"], means["metric"], "o-", color="C0",
                label=f"small batch, 1-{rung_multiple(ladder[-1])}x its epochs (mean)")
    if test.control:
        star = means[means[by] == test.control]
        ax.plot(star["loss"], star["metric"], "o", ms=14, mfc="none", mec="C0", mew=1.5,
                label=f"SB* = {test.control} (nearest train loss)")
    styles = [(test.recipe, "*", "C3", 14.0), *[(o, m, c, 8.0) for o, m, c in zip(others, "sD", ("C2", "C7"))]]
    for name, marker, color, size in styles:
        mine = ok[ok[by] == name]
        if len(mine):
            ax.scatter(mine[loss], mine[metric], s=12, color=color, alpha=0.35, linewidths=0)
            ax.plot([_geometric_mean(mine[loss])], [mine[metric].mean()], linestyle="none", marker=marker,
                    color=color, ms=size, label=variant_label(name))
    # the y axis spans the ladder's and the recipe's runs, so that a difference at the test's margin (a point)
    # stays visible; `others` far below (plain LB, under-trained) are named off the axis instead
    shown = ok.loc[ok[by].isin([*ladder, test.recipe]), metric]
    if len(shown):
        low, high = float(shown.min()), float(shown.max())
        pad = max(0.15 * (high - low), 0.002)
        ax.set_ylim(low - pad, high + pad)
        other_means = {name: float(ok.loc[ok[by] == name, metric].mean()) for name in others if (ok[by] == name).any()}
        off = [f"{variant_label(name)}: mean {m:.3g}" for name, m in other_means.items()
               if not low - pad <= m <= high + pad]
        if off:
            ax.text(0.98, 0.02, "off the axis: " + "; ".join(off), transform=ax.transAxes, ha="right",
                    va="bottom", fontsize="x-small", color="C7")
    ax.set_xscale("log")
    ax.set(xlabel=f"final {axis_label(loss)} (log)", ylabel=axis_label(metric))
    ax.legend(fontsize="x-small")
    return ax


def distance_panel(ax: plt.Axes, history: pd.DataFrame, t_min: float = FIT_T_MIN, color: object = "C0",
                   x: str = "step", min_decades: float = MIN_DECADES) -> LogTimeFit:
    """One variant's distance from initialisation against steps (log x axis), with the two fits drawn.

    `history`: the long-form history (results.load_history) of ONE variant's runs. Drawn: each run thin,
    the mean over runs at each step thick; the fitted range shaded; over that range, the log model
    (dashed) and the power law (dotted) fitted to the drawn mean curve (fit_log_time from t_min to the
    end of the first lr phase), so the R^2 and AIC in the legend are those of the lines drawn. Returns
    that fit.
    """
    keys = [c for c in ("run_id", "seed") if c in history] or [x]
    curves = history[history[x] > 0]
    for _, run in curves.groupby(keys[0], sort=False):
        run = run.sort_values(x)
        ax.plot(run[x], run["distance_from_init"], color=color, linewidth=0.6, alpha=0.4)
    mean = curves.groupby(x, as_index=False)["distance_from_init"].mean()
    ax.plot(mean[x], mean["distance_from_init"], color=color, linewidth=2,
            label=f"mean of {curves[keys[0]].nunique()} runs")
    ends = [constant_lr_end(run) for _, run in history.groupby(keys[0], sort=False)] if "lr" in history else []
    fit = fit_log_time(mean[x], mean["distance_from_init"], t_min, min(ends) if ends else math.inf)
    if fit.n_points >= 4:
        ax.axvspan(fit.t_min, fit.t_max, color="0.9", zorder=0, linewidth=0)
        t = np.geomspace(fit.t_min, fit.t_max, 60)
        ax.plot(t, fit.predict(t), "--", color="k", linewidth=1.2, label=f"a + b ln t, R$^2$ {fit.r2:.3f}")
        ax.plot(t, fit.predict_power(t), ":", color="k", linewidth=1.5,
                label=f"c t^{fit.alpha:.2f}, R$^2$ {fit.r2_power:.3f}")
        verdict = "log better" if fit.delta_aic > 0 else "power better"
        note = (f"AIC power - log {fit.delta_aic:+.1f} ({verdict})" if fit.decades >= min_decades
                else f"fit over {fit.decades:.1f} decades < {min_decades:g}: not compared")
        ax.text(0.02, 0.98, f"fitted: steps {fit.t_min:g}-{fit.t_max:g}\n{note}", transform=ax.transAxes,
                va="top", fontsize="x-small")
    else:
        ax.text(0.02, 0.98, f"{fit.n_points} evaluations from step {t_min:g} to the first lr decay: no fit",
                transform=ax.transAxes, va="top", fontsize="x-small")
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())   # a short run's axis would label every minor tick
    ax.set(xlabel=axis_label(x), ylabel="|w - w0|")
    ax.legend(fontsize="x-small", loc="lower right")
    return fit
