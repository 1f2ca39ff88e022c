"""Hoffer et al. (2017), "Train longer, generalize better": sqrt lr scaling, ghost batch norm and regime
adaptation close the large-batch gap; the distance from initialisation grows like log(t). Analysis and
figures; no torch import.

    ingredient_effects(rows, "test_acc", ["lb", "lb_sqrt", "lb_gbn", "lb_sqrt_gbn"])  # each ingredient's effect
    fits = distance_fits(results.load_history(rows, ["variant", "seed"]))            # distance vs log(steps)
    distance_vs_steps(ax, history, fits)

Distances are the history's `distance_from_init`: the L2 norm of (weights - initial weights) over all
parameters. Setting and pre-registered test: docs/protocols.md#hoffer.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..plots.sweeps import (
    axis_label,
    interval_yerr,
    present_in_order,
    variant_colors,
)
from ..stats import welch_interval


# ----------------------------------------------------------------------------- ingredients of the recipe
def ingredient_pairs(names: Sequence[str], sep: str = "_") -> list[tuple[str, str, str]]:
    """(ingredient, with, without) for every pair of variant names that differ by one ingredient.

    A name is a base and its ingredients joined by `sep` ("lb_sqrt_gbn": base lb, ingredients sqrt and
    gbn); "without" is the name with one ingredient removed, when the spec has that variant. So a
    factorial set of variants gives every ingredient's effect with the others held fixed.
    """
    present = set(names)
    pairs = []
    for name in names:
        base, *ingredients = name.split(sep)
        for ingredient in ingredients:
            without = sep.join([base, *[i for i in ingredients if i != ingredient]])
            if without in present:
                pairs.append((ingredient, name, without))
    return pairs


def ingredient_effects(rows: pd.DataFrame, metric: str, names: Sequence[str], by: str = "variant", sep: str = "_",
                       confidence: float = 0.95) -> pd.DataFrame:
    """The effect of adding each ingredient (ingredient_pairs): mean `metric` of the variant with it minus
    the variant without it, Welch's interval over seeds (runs with state "ok"). Columns: ingredient,
    with, without, diff, low, high, n, n_reference; sorted by ingredient, in the order of `names`."""
    ok = rows[rows["state"] == "ok"]
    out = []
    for ingredient, with_, without in ingredient_pairs(names, sep):
        d = welch_interval(ok[ok[by] == with_][metric], ok[ok[by] == without][metric], confidence)
        out.append({"ingredient": ingredient, "with": with_, "without": without, "diff": d.diff,
                    "low": d.low, "high": d.high, "n": d.n_a, "n_reference": d.n_b})
    table = pd.DataFrame(out, columns=["ingredient", "with", "without", "diff", "low", "high", "n", "n_reference"])
    first = {name: i for i, (name, _, _) in reversed(list(enumerate(ingredient_pairs(names, sep))))}
    return table.sort_values("ingredient", key=lambda c: c.map(first), kind="stable").reset_index(drop=True)


# ----------------------------------------------------------------------------- distance vs log(steps)
@dataclass(frozen=True)
class LogTimeFit:
    """Least-squares fits of the distance d(t) from initialisation against the step t, over t_min..t_max.

    log model:   d = intercept + slope * ln t       (Hoffer et al.: "ultra-slow diffusion")
    power model: d = scale * t ** alpha             (fitted as ln d = ln scale + alpha ln t; a random walk
                                                     at a fixed step size has alpha = 1/2)
    Both R^2 are computed on d itself (the power model's prediction back-transformed), so they compare.
    """
    slope: float        # distance per unit of ln t (per factor e of steps)
    intercept: float    # distance at t = 1 by the log model
    r2: float           # R^2 of the log model, on d
    alpha: float        # power-law exponent
    scale: float        # power-law prefactor
    r2_power: float     # R^2 of the power model, on d
    n_points: int
    t_min: float
    t_max: float

    def predict(self, t: np.ndarray) -> np.ndarray:
        """The log model's distance at steps t."""
        return self.intercept + self.slope * np.log(np.asarray(t, dtype=float))

    def predict_power(self, t: np.ndarray) -> np.ndarray:
        return self.scale * np.asarray(t, dtype=float) ** self.alpha


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / total if total > 0 else math.nan


def fit_log_time(steps: Sequence[float], distance: Sequence[float], t_min: float = 1.0,
                 t_max: float = math.inf) -> LogTimeFit:
    """Fit d = a + b ln t (and d = c t^alpha) to the points with t_min <= t <= t_max and d > 0.

    Fewer than 3 such points give NaN parameters (n_points says how many there were).
    """
    t = np.asarray(steps, dtype=float)
    d = np.asarray(distance, dtype=float)
    keep = (t >= t_min) & (t <= t_max) & (t > 0) & np.isfinite(d) & (d > 0)
    t, d = t[keep], d[keep]
    if len(t) < 3:
        nan = math.nan
        return LogTimeFit(nan, nan, nan, nan, nan, nan, len(t), t_min, t_max)
    slope, intercept = np.polyfit(np.log(t), d, 1)
    alpha, log_scale = np.polyfit(np.log(t), np.log(d), 1)
    r2 = _r2(d, intercept + slope * np.log(t))
    r2_power = _r2(d, math.exp(log_scale) * t ** alpha)
    return LogTimeFit(float(slope), float(intercept), r2, float(alpha), math.exp(log_scale), r2_power,
                      len(t), float(t.min()), float(t.max()))


def constant_lr_end(history: pd.DataFrame, rtol: float = 1e-6) -> float:
    """The last evaluated step whose preceding update used the peak lr: the end of the first lr phase.

    One run's history rows (columns step, lr; `lr` is the rate of the update before that evaluation).
    After warmup and before the first decay of a step schedule the lr is at its peak; with a constant
    schedule this is the last step.
    """
    rows = history[history["step"] > 0]
    if not len(rows):
        return math.nan
    peak = rows["lr"].max()
    return float(rows[rows["lr"] >= peak * (1 - rtol)]["step"].max())


def distance_fits(history: pd.DataFrame, by: Sequence[str] = ("variant", "seed"), t_min: float = 10.0,
                  first_phase: bool = True) -> pd.DataFrame:
    """fit_log_time per run of a long-form history (results.load_history), one row per run.

    Runs are told apart by the `by` columns (with run_id: a run shared by two variants is fitted under
    each). first_phase: fit only up to constant_lr_end (the constant-lr phase before the first decay,
    where Hoffer et al.'s diffusion argument applies); else the whole run. Columns: the `by` columns,
    run_id, and the LogTimeFit fields.
    """
    keys = [c for c in (*by, "run_id") if c in history]
    rows = []
    for key, run in history.groupby(keys, sort=False):
        run = run.sort_values("step")
        t_max = constant_lr_end(run) if first_phase else math.inf
        fit = fit_log_time(run["step"], run["distance_from_init"], t_min, t_max)
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,))), **dataclasses.asdict(fit)})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- figures
def variant_points(ax: plt.Axes, rows: pd.DataFrame, table: pd.DataFrame, y: str = "test_acc",
                   by: str = "variant", order: Sequence[str] | None = None) -> plt.Axes:
    """One row of the y axis per variant: the mean of `y` over seeds with its t-interval, seeds as dots.

    `rows`: one row per run (state ok are drawn); `table`: stats.summarize_states (or stats.summarize)
    by `by`. Variants are listed top to bottom in `order` (default: the table's order).
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
    ax.set_yticks(list(positions.values()), list(positions.keys()))
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.set(xlabel=axis_label(y))
    ax.grid(axis="x", alpha=0.3)
    return ax


def distance_vs_steps(ax: plt.Axes, history: pd.DataFrame, fits: pd.DataFrame | None = None,
                      hue: str = "variant", order: Sequence[str] | None = None, x: str = "step",
                      colors: dict[str, tuple] | None = None) -> plt.Axes:
    """Distance from initialisation against steps on a log x axis (so d = a + b ln t is a straight line).

    `history`: long form (results.load_history with the `hue` column); the line is the mean over seeds
    at each evaluated step, the band the range over seeds. `fits` (distance_fits, one row per run
    with `hue`): the log model with the seeds' mean slope and intercept is drawn dashed over the fitted
    range, its mean R^2 in the legend. `colors`: hue value -> colour (default: variant_colors of the order).
    """
    names = present_in_order(history[hue], order)
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
    ax.set(xlabel=axis_label(x), ylabel="distance from initialisation |w - w0|")
    ax.legend(fontsize="small")
    return ax
