"""Hoffer et al. (2017), "Train longer, generalize better": sqrt lr scaling, ghost batch norm and regime
adaptation close the large-batch gap; the distance from initialisation grows like log(t).
No torch import.

    test = recipe_test(rows)                                     # the pre-registered test: verdict first
    mechanism = matched_loss_test(rows)                          # v4: against the small batch nearest in train loss
    ingredient_effects(rows, "test_acc", ["lb", "lb_sqrt", "lb_gbn", "lb_sqrt_gbn"])  # each ingredient's effect
    fits = distance_fits(results.load_history(rows, ["variant", "seed"]))            # distance vs log(steps)
    aic_table(fits)                                              # log t against a power law, per variant
    figures.distance_panel(ax, history[history.variant == "sb"], t_min=5)

Distances are the history's `distance_from_init`: the L2 norm of (weights - initial weights) over all
parameters. Setting and pre-registered test: docs/protocols.md#hoffer.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.hoffer (`figures` above).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config import ConfigError
from ..rundir import FINISHED_STATES as FINISHED  # the end states of a run that count (others are rerun)
from ..stats import welch_interval
from .verdict import PreregisteredTest, Verdict


# ----------------------------------------------------------------------------- the pre-registered test
@dataclass(frozen=True)
class RecipeTest(PreregisteredTest):
    """docs/protocols.md#hoffer: the recipe (LB with sqrt lr, ghost BN and regime adaptation) against SB.

    Every difference is mean(first) - mean(second) of the final metric over the seeds that ended ok, with
    Welch's 95% interval, in the metric's units (accuracy: a fraction; 0.01 = 1 point).
    """
    diff: float              # Delta: recipe - sb (the primary statistic)
    low: float
    high: float
    gap: float               # lb - sb: the gap to close (validity: its interval lies below -margin)
    gap_low: float
    gap_high: float
    closed: float            # recipe - lb: how much of the gap the recipe closes (decides "partly")
    closed_low: float
    closed_high: float
    n_recipe: int            # seeds that ended ok
    n_sb: int
    n_lb: int
    n_recipe_diverged: int   # a diverged seed of the recipe counts against it: never "reproduced"
    n_unfinished: int        # runs of the three variants that failed, timed out, ... (rerun them)
    margin: float            # 0.01 = 1 point
    verdict: Verdict
    why: str                 # the rule that decided, in words
    extend_seeds: bool       # an interval that decides contains its threshold with < 8 seeds (protocol item 3)


def _straddles(low: float, high: float, threshold: float) -> bool:
    return bool(low <= threshold <= high)


def recipe_test(rows: pd.DataFrame, metric: str = "test_acc", margin: float = 0.01, recipe: str = "lb_sqrt_gbn_ra",
                small: str = "sb", large: str = "lb", by: str = "variant") -> RecipeTest:
    """The pre-registered test of docs/protocols.md#hoffer, from one row per run (sweep.runs_per_variant).

    reproduced: Delta = recipe - small has a Welch interval whose lower end is above -margin, and no seed of
    the recipe diverged; partly: not so, but recipe - large has an interval above 0 (part of the gap is
    closed); not reproduced: neither. not testable: a run of the three variants has not finished (state
    other than ok or diverged), a variant has fewer than 2 finished seeds, or there is no gap to close
    (large - small does not have its interval's upper end below -margin).
    """
    for column in (by, metric, "state"):
        if column not in rows:
            raise ConfigError(f"recipe_test: the runs table has no column {column!r}; it needs {by}, {metric}, state")
    mine = rows[rows[by].isin([recipe, small, large])]
    ok = mine[mine["state"] == "ok"]
    unfinished = int((~mine["state"].isin(FINISHED)).sum())
    diverged = int(((mine[by] == recipe) & (mine["state"] == "diverged")).sum())
    d = welch_interval(ok[ok[by] == recipe][metric], ok[ok[by] == small][metric])
    gap = welch_interval(ok[ok[by] == large][metric], ok[ok[by] == small][metric])
    closed = welch_interval(ok[ok[by] == recipe][metric], ok[ok[by] == large][metric])
    n_large = gap.n_a
    if unfinished:
        verdict, why = Verdict.NOT_TESTABLE, f"{unfinished} runs have not finished (rerun them with --retry-failed)"
    elif min(d.n_a, d.n_b, n_large) < 2 or not (math.isfinite(d.low) and math.isfinite(gap.high)):
        verdict, why = Verdict.NOT_TESTABLE, (f"fewer than 2 finished seeds (recipe {d.n_a}, {small} {d.n_b}, "
                                              f"{large} {n_large})")
    elif not gap.high < -margin:
        verdict, why = Verdict.NOT_TESTABLE, (f"no gap to close: {large} - {small} interval's upper end "
                                              f"{100 * gap.high:+.2f} points is not below {-100 * margin:+.2f}")
    elif d.low > -margin and not diverged:
        verdict, why = Verdict.REPRODUCED, f"Delta's lower end {100 * d.low:+.2f} points > {-100 * margin:+.2f}"
    elif closed.low > 0:
        verdict, why = Verdict.PARTLY, (f"Delta's lower end {100 * d.low:+.2f} points <= {-100 * margin:+.2f}"
                                        + (f" or {diverged} recipe seeds diverged" if diverged else "")
                                        + f"; recipe - {large} lower end {100 * closed.low:+.2f} > 0")
    else:
        verdict, why = Verdict.NOT_REPRODUCED, (f"Delta's lower end {100 * d.low:+.2f} points <= {-100 * margin:+.2f}"
                                                + (f" or {diverged} recipe seeds diverged" if diverged else "")
                                                + f"; recipe - {large} lower end {100 * closed.low:+.2f} <= 0")
    deciding = [(gap.low, gap.high, -margin), (d.low, d.high, -margin)]
    if verdict in (Verdict.PARTLY, Verdict.NOT_REPRODUCED):
        deciding.append((closed.low, closed.high, 0.0))
    computed = not unfinished and min(d.n_a, d.n_b, n_large) >= 2
    extend = computed and min(d.n_a, d.n_b, n_large) < 8 and any(_straddles(*x) for x in deciding)
    return RecipeTest(d.diff, d.low, d.high, gap.diff, gap.low, gap.high, closed.diff, closed.low, closed.high,
                      d.n_a, d.n_b, n_large, diverged, unfinished, margin, verdict, why, extend)


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


# ----------------------------------------------------------------------------- the mechanism test (protocol v4)
LADDER = ("sb", "sb_x2", "sb_x4", "sb_x8", "sb_x16")   # the small batch at 1, 2, 4, 8, 16 times its epochs


def rung_multiple(name: str) -> int:
    """How many times its version-1 epochs a ladder rung trains, read from its name: sb -> 1, sb_x16 -> 16."""
    _, sep, tail = name.rpartition("_x")
    return int(tail) if sep and tail.isdigit() else 1


def _geometric_mean(values: pd.Series) -> float:
    """exp(mean(log v)) over the positive finite values (NaN when there are none)."""
    v = pd.to_numeric(values, errors="coerce").to_numpy(float)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.exp(np.log(v).mean())) if len(v) else math.nan


@dataclass(frozen=True)
class MatchedControl:
    """The small-batch run type whose final train loss is nearest the reference's (docs/protocols.md,
    Hoffer's mechanism test): losses are compared as geometric means over the seeds that ended ok, on a log
    scale, because a longer schedule lowers the train loss by factors, not by amounts."""
    reference: str
    control: str             # the nearest candidate ("" when no candidate has a finished run)
    reference_loss: float    # geometric mean of the reference's final `loss` over its ok seeds
    control_loss: float
    log2_distance: float     # log2(control_loss / reference_loss): 0 is an exact match
    reached: bool            # some candidate's geometric mean is at or below the reference's (the ladder
    #                          goes as far as the reference in fitting the training set)
    table: pd.DataFrame      # per candidate: `by`, n_ok, loss (geometric mean), log2_distance


def matched_control(rows: pd.DataFrame, reference: str = "lb_sqrt_gbn_ra", candidates: Sequence[str] = LADDER,
                    loss: str = "train_loss", by: str = "variant") -> MatchedControl:
    """The candidate (e.g. the small batch trained for 1, 2, 4, ... times its epochs) whose geometric-mean
    final `loss` over its ok seeds is nearest, in |log|, to the reference's; ties go to the first in
    `candidates`' order. `rows`: one row per run with `by`, `loss` and state."""
    for column in (by, loss, "state"):
        if column not in rows:
            raise ConfigError(f"matched_control: the runs table has no column {column!r}")
    ok = rows[rows["state"] == "ok"]
    ref_loss = _geometric_mean(ok.loc[ok[by] == reference, loss])
    table = []
    for name in candidates:
        mine = ok[ok[by] == name]
        value = _geometric_mean(mine[loss])
        distance = math.log2(value / ref_loss) if value > 0 and ref_loss > 0 else math.nan
        table.append({by: name, "n_ok": len(mine), "loss": value, "log2_distance": distance})
    frame = pd.DataFrame(table, columns=[by, "n_ok", "loss", "log2_distance"])
    scored = frame.dropna(subset=["log2_distance"])
    if not len(scored):
        return MatchedControl(reference, "", ref_loss, math.nan, math.nan, False, frame)
    best = scored.loc[scored["log2_distance"].abs().idxmin()]
    reached = bool((scored["loss"] <= ref_loss).any())
    return MatchedControl(reference, str(best[by]), ref_loss, float(best["loss"]), float(best["log2_distance"]),
                          reached, frame)


@dataclass(frozen=True)
class MatchedLossRecipeTest(PreregisteredTest):
    """Hoffer's mechanism test (docs/protocols.md, protocol v4): the recipe against a small batch that had the
    same chance to fit the training set. Differences are mean(first) - mean(second) of the final metric over
    the seeds that ended ok, Welch's 95% interval, in the metric's units (0.01 = 1 point)."""
    recipe: str
    control: str             # SB*: the rung of the ladder nearest the recipe in final train loss
    diff: float              # Delta_loss = recipe - SB* (the primary statistic)
    low: float
    high: float
    short: str               # the small batch of the original test (its own, shorter schedule)
    short_diff: float        # Delta_orig = recipe - short (decides "partly")
    short_low: float
    short_high: float
    recipe_loss: float       # geometric means of the final train loss (matched_control)
    control_loss: float
    log2_distance: float
    reached: bool
    n_recipe: int
    n_control: int
    n_short: int
    n_recipe_diverged: int
    n_unfinished: int        # runs of the recipe and the ladder that failed, timed out, ... (rerun them)
    margin: float
    verdict: Verdict
    why: str
    extend_seeds: bool       # a deciding interval contains its threshold with < 8 seeds (statistics item 3)
    ladder: pd.DataFrame     # matched_control's table


def matched_loss_test(rows: pd.DataFrame, recipe: str = "lb_sqrt_gbn_ra", ladder: Sequence[str] = LADDER,
                      short: str = "sb", metric: str = "test_acc", loss: str = "train_loss", margin: float = 0.01,
                      by: str = "variant") -> MatchedLossRecipeTest:
    """The recipe's test accuracy against SB*, the small-batch rung of `ladder` whose final train loss is
    nearest the recipe's (matched_control), and against `short`, the original small batch.

    reproduced: Delta_loss = recipe - SB* has a Welch interval whose lower end is above -margin, and no seed
    of the recipe diverged; partly: not so, but Delta_orig = recipe - short has its lower end above -margin
    (the recipe matches the small batch only when the small batch fits the training set less well); not
    reproduced: neither. not testable: a run of the recipe or the ladder has not finished, a compared variant
    has fewer than 2 finished seeds, or no rung of the ladder reaches the recipe's train loss (extend the
    ladder by one rung, once, as the protocol says).
    """
    for column in (by, metric, loss, "state"):
        if column not in rows:
            raise ConfigError(f"matched_loss_test: the runs table has no column {column!r}")
    mine = rows[rows[by].isin([recipe, *ladder, short])]
    unfinished = int((~mine["state"].isin(FINISHED)).sum())
    diverged = int(((mine[by] == recipe) & (mine["state"] == "diverged")).sum())
    match = matched_control(rows, recipe, ladder, loss, by)
    ok = mine[mine["state"] == "ok"]
    d = welch_interval(ok[ok[by] == recipe][metric], ok[ok[by] == match.control][metric])
    s = welch_interval(ok[ok[by] == recipe][metric], ok[ok[by] == short][metric])
    n_control = d.n_b if match.control else 0
    if unfinished:
        verdict, why = Verdict.NOT_TESTABLE, f"{unfinished} runs have not finished (rerun them with --retry-failed)"
    elif min(d.n_a, n_control, s.n_b) < 2 or not math.isfinite(d.low):
        verdict, why = Verdict.NOT_TESTABLE, (f"fewer than 2 finished seeds (recipe {d.n_a}, "
                                              f"SB* {match.control or '-'} {n_control}, {short} {s.n_b})")
    elif not match.reached:
        verdict, why = Verdict.NOT_TESTABLE, (f"no rung of the ladder reaches the recipe's train loss "
                                              f"{match.reference_loss:.3g} (nearest: {match.control} at "
                                              f"{match.control_loss:.3g}): extend the ladder by one rung, once")
    elif d.low > -margin and not diverged:
        verdict, why = Verdict.REPRODUCED, (f"Delta_loss (recipe - {match.control}) lower end "
                                            f"{100 * d.low:+.2f} points > {-100 * margin:+.2f}")
    elif s.low > -margin:
        verdict, why = Verdict.PARTLY, (f"Delta_loss lower end {100 * d.low:+.2f} points <= {-100 * margin:+.2f}"
                                        + (f" or {diverged} recipe seeds diverged" if diverged else "")
                                        + f"; Delta_orig (recipe - {short}) lower end {100 * s.low:+.2f} > "
                                        f"{-100 * margin:+.2f}")
    else:
        verdict, why = Verdict.NOT_REPRODUCED, (f"Delta_loss lower end {100 * d.low:+.2f} and Delta_orig lower end "
                                                f"{100 * s.low:+.2f} points, both <= {-100 * margin:+.2f}")
    deciding = [(d.low, d.high, -margin)] + ([(s.low, s.high, -margin)] if verdict != Verdict.REPRODUCED else [])
    extend = (verdict != Verdict.NOT_TESTABLE and min(d.n_a, n_control, s.n_b) < 8
              and any(_straddles(*x) for x in deciding))
    return MatchedLossRecipeTest(recipe, match.control, d.diff, d.low, d.high, short, s.diff, s.low, s.high,
                           match.reference_loss, match.control_loss, match.log2_distance, match.reached, d.n_a,
                           n_control, s.n_b, diverged, unfinished, margin, verdict, why, extend, match.table)


# ----------------------------------------------------------------------------- distance vs log(steps)
@dataclass(frozen=True)
class LogTimeFit:
    """Least-squares fits of the distance d(t) from initialisation against the step t, over t_min..t_max.

    log model:   d = intercept + slope * ln t       (Hoffer et al.: "ultra-slow diffusion")
    power model: d = scale * t ** alpha             (a random walk at a fixed step size has alpha = 1/2)
    Both are fitted to the same points by least squares on d itself (the same error model: independent
    Gaussian errors of one variance on d), so their R^2 and AIC compare. AIC = n ln(RSS/n) + 2k with k = 3
    (two parameters and the variance) for both; delta_aic = aic_power - aic_log > 0 favours the log model
    (by Burnham & Anderson's rule of thumb, > 2 is support, > 10 strong support).
    """
    slope: float        # distance per unit of ln t (per factor e of steps)
    intercept: float    # distance at t = 1 by the log model
    r2: float           # R^2 of the log model, on d
    alpha: float        # power-law exponent
    scale: float        # power-law prefactor
    r2_power: float     # R^2 of the power model, on d
    aic_log: float
    aic_power: float
    delta_aic: float    # aic_power - aic_log: > 0 favours d = a + b ln t
    n_points: int
    t_min: float        # the smallest and largest step of the points fitted (the requested range before a fit)
    t_max: float
    decades: float      # log10(t_max / t_min) of the points fitted

    def predict(self, t: Sequence[float] | np.ndarray) -> np.ndarray:
        """The log model's distance at steps t."""
        return self.intercept + self.slope * np.log(np.asarray(t, dtype=float))

    def predict_power(self, t: Sequence[float] | np.ndarray) -> np.ndarray:
        return self.scale * np.asarray(t, dtype=float) ** self.alpha


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / total if total > 0 else math.nan


def gaussian_aic(residuals: np.ndarray, n_parameters: int) -> float:
    """AIC of a least-squares fit with independent Gaussian errors of one unknown variance:
    n ln(RSS/n) + 2k, k = n_parameters + 1 (the variance). RSS is floored at 1e-300 (an exact fit)."""
    n = len(residuals)
    rss = max(float(np.sum(np.square(residuals))), 1e-300)
    return n * math.log(rss / n) + 2 * (n_parameters + 1)


def _power_fit(t: np.ndarray, d: np.ndarray) -> tuple[float, float]:
    """(scale, alpha) of d = scale t^alpha by least squares on d, started from the fit of ln d on ln t."""
    from scipy.optimize import curve_fit
    alpha0, log_scale0 = np.polyfit(np.log(t), np.log(d), 1)
    try:
        (scale, alpha), _ = curve_fit(lambda x, c, a: c * x ** a, t, d, p0=(math.exp(log_scale0), alpha0),
                                      maxfev=10_000)
    except RuntimeError:   # no convergence: keep the log-log fit (its RSS on d is then an upper bound)
        scale, alpha = math.exp(log_scale0), alpha0
    return float(scale), float(alpha)


def fit_log_time(steps: Sequence[float] | np.ndarray, distance: Sequence[float] | np.ndarray, t_min: float = 1.0,
                 t_max: float = math.inf) -> LogTimeFit:
    """Fit d = a + b ln t and d = c t^alpha, both by least squares on d, to the points with
    t_min <= t <= t_max and d > 0.

    Fewer than 4 such points give NaN parameters (n_points says how many there were; the requested
    t_min and t_max are kept).
    """
    t = np.asarray(steps, dtype=float)
    d = np.asarray(distance, dtype=float)
    keep = (t >= t_min) & (t <= t_max) & (t > 0) & np.isfinite(d) & (d > 0)
    t, d = t[keep], d[keep]
    if len(t) < 4:
        nan = math.nan
        return LogTimeFit(nan, nan, nan, nan, nan, nan, nan, nan, nan, len(t), t_min, t_max, nan)
    slope, intercept = np.polyfit(np.log(t), d, 1)
    scale, alpha = _power_fit(t, d)
    pred_log, pred_power = intercept + slope * np.log(t), scale * t ** alpha
    aic_log, aic_power = gaussian_aic(d - pred_log, 2), gaussian_aic(d - pred_power, 2)
    return LogTimeFit(float(slope), float(intercept), _r2(d, pred_log), alpha, scale, _r2(d, pred_power),
                      aic_log, aic_power, aic_power - aic_log, len(t), float(t.min()), float(t.max()),
                      math.log10(float(t.max() / t.min())))


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


FIT_T_MIN = 5.0      # first step of the distance fits: the SB's first lr phase (to step ~750) then spans 2.2 decades
MIN_DECADES = 2.0    # a log-t vs power-law comparison needs points over at least this many decades of steps


def distance_fits(history: pd.DataFrame, by: Sequence[str] = ("variant", "seed"), t_min: float = FIT_T_MIN,
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


def aic_table(fits: pd.DataFrame, by: str = "variant", min_decades: float = MIN_DECADES,
              order: Sequence[str] | None = None) -> pd.DataFrame:
    """Log t against the power law per run type, from distance_fits (one row per run).

    Per value of `by`: n_runs, the fitted range (t_min, t_max, decades: the smallest over the runs),
    the AICs summed over the runs (the AIC of fitting every run with its own parameters), their
    difference aic_power - aic_log (> 0 favours log t), the mean per-run difference with its 95% t
    interval over seeds, n_log_better (runs with delta_aic > 0), and `tested`: every run's points span at
    least `min_decades` decades (otherwise the comparison says little and is not read as evidence).
    """
    from ..stats import t_interval

    def total(values: pd.Series) -> float:
        return float(values.sum()) if len(values) else math.nan

    out = []
    for name, group in fits.groupby(by, sort=False):
        group = group.dropna(subset=["delta_aic"])
        mean, _, low, high = t_interval(group["delta_aic"])
        decades = float(group["decades"].min()) if len(group) else math.nan
        out.append({by: name, "n_runs": len(group),
                    "t_min": float(group["t_min"].min()) if len(group) else math.nan,
                    "t_max": float(group["t_max"].max()) if len(group) else math.nan, "decades": decades,
                    "aic_log": total(group["aic_log"]), "aic_power": total(group["aic_power"]),
                    "delta_aic": total(group["delta_aic"]), "delta_aic_mean": mean,
                    "delta_aic_low": low, "delta_aic_high": high,
                    "n_log_better": int((group["delta_aic"] > 0).sum()),
                    "r2_log": float(group["r2"].mean()), "r2_power": float(group["r2_power"].mean()),
                    "alpha": float(group["alpha"].mean()),
                    "tested": bool(len(group)) and decades >= min_decades})
    table = pd.DataFrame(out)
    if order is not None and len(table):
        table = table.set_index(by).loc[[v for v in order if v in set(table[by])]].reset_index()
    return table
