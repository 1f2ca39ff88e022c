"""Analysis for the large-batch recipes (Hoffer et al. 2017, Goyal et al. 2017). No torch import.

    rows = runs_per_variant(results.load("goyal"), load_spec("experiments/goyal.yaml"))
    table = summarize_states(rows, ["variant", "batch_size"], ["test_acc"])    # + n_ok, n_diverged
    verdict = breaking_batch(table, "test_acc", drop=0.01)                      # where a rule breaks
    versus_baseline_batch(rows, "test_acc", 32)   # each rule at each batch size minus itself at 32 (Welch)
    versus_within(rows, "test_acc", "batch_size", "variant", "linear_warmup")  # rules against one, per batch
    versus_reference(rows, "test_acc", {"variant": "sb"})                       # each variant minus the SB
    ingredient_effects(rows, "test_acc", ["lb", "lb_sqrt", "lb_gbn", "lb_sqrt_gbn"])  # each ingredient's effect
    fits = distance_fits(results.load_history(rows, ["variant", "seed"]))      # distance vs log(steps)
    markdown_table(table, ["variant", "batch_size"], ["test_acc"])             # "mean ± std" cells

Conventions: a "rule" or "recipe" is a spec variant; a run diverged when its state is "diverged" (the
library's verdict: a non-finite batch loss, or one above divergence_ratio x the first). Distances are the
history's `distance_from_init`: the L2 norm of (weights - initial weights) over all parameters.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .config import ConfigError
from .results import summarize
from .sweep.spec import SweepSpec, expand


# ----------------------------------------------------------------------------- one row per variant
def runs_per_variant(runs: pd.DataFrame, spec: SweepSpec) -> pd.DataFrame:
    """One row per (variant, grid point, seed) of `spec`, each a copy of the row of `runs` with that config.

    A sweep runs a config once even when several variants give it (e.g. every lr-scaling rule at the base
    batch size); its manifest then names the first variant only. Here the run appears under each variant
    that gives its config, with that `variant` (and the variant's grid coordinates). Points not in `runs`
    (not loaded, or another spec) are left out. A spec without variants returns `runs` unchanged.
    """
    if not spec.variants:
        return runs.reset_index(drop=True)
    by_id = runs.drop_duplicates("run_id").set_index("run_id", drop=False)
    rows = []
    for name, fields in spec.variants.items():
        for point in expand(dataclasses.replace(spec, variants={name: fields})):
            if point.run_id in by_id.index:
                rows.append({**by_id.loc[point.run_id].to_dict(), **point.coords})
    return pd.DataFrame(rows, columns=list(dict.fromkeys([*runs.columns, "variant"])))


def variant_order(spec: SweepSpec) -> list[str]:
    """The variants in the order the spec writes them (for tables and legends)."""
    return list(spec.variants)


# ----------------------------------------------------------------------------- outcomes per group
def summarize_states(rows: pd.DataFrame, by: str | Sequence[str], metrics: Sequence[str],
                     confidence: float = 0.95) -> pd.DataFrame:
    """results.summarize over the runs that ended "ok", plus per group n_runs, n_ok, n_diverged and
    n_other (failed, oom, timeout, died, pending). A group whose every run diverged keeps a row (n = 0,
    NaN statistics): divergence is a result, not a missing value."""
    by = [by] if isinstance(by, str) else list(by)
    counts = rows.groupby(by, sort=True, dropna=False)["state"].agg(
        n_runs="size", n_ok=lambda s: int((s == "ok").sum()), n_diverged=lambda s: int((s == "diverged").sum()))
    counts["n_other"] = counts["n_runs"] - counts["n_ok"] - counts["n_diverged"]
    table = counts.reset_index()
    ok = rows[rows["state"] == "ok"]
    if len(ok):
        table = table.merge(summarize(ok, by, metrics, confidence), on=by, how="left")
    else:
        table = table.assign(n=0, **{f"{m}_{s}": math.nan for m in metrics for s in ("mean", "std", "low", "high")})
    table["n"] = table["n"].fillna(0).astype(int)
    return table


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


# ----------------------------------------------------------------------------- differences between groups
@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) with Welch's t-interval (unequal variances) over independent seeds."""
    diff: float
    low: float
    high: float
    n_a: int
    n_b: int


def welch_interval(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Difference:
    """mean(a) - mean(b) and its Welch-Satterthwaite t-interval; NaN bounds with fewer than 2 values in a
    group (NaN values are dropped first)."""
    from scipy import stats
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    a, b = a[np.isfinite(a)], b[np.isfinite(b)]
    if not len(a) or not len(b):
        return Difference(math.nan, math.nan, math.nan, len(a), len(b))
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return Difference(diff, math.nan, math.nan, len(a), len(b))
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(diff, diff, diff, len(a), len(b))
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, dof)) * se
    return Difference(diff, diff - half, diff + half, len(a), len(b))


def versus_reference(rows: pd.DataFrame, metric: str, reference: dict[str, object], by: str | Sequence[str] = "variant",
                     confidence: float = 0.95) -> pd.DataFrame:
    """Per group of `by`: mean `metric` minus that of the reference runs (the rows matching every
    column = value of `reference`), with Welch's interval. Only runs with state "ok" count.
    Columns: the `by` columns, diff, low, high, n, n_reference."""
    by = [by] if isinstance(by, str) else list(by)
    ok = rows[rows["state"] == "ok"]
    ref = ok
    for column, value in reference.items():
        ref = ref[ref[column] == value]
    out = []
    for key, group in ok.groupby(by, sort=False):
        d = welch_interval(group[metric], ref[metric], confidence)
        out.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))),
                    "diff": d.diff, "low": d.low, "high": d.high, "n": d.n_a, "n_reference": d.n_b})
    return pd.DataFrame(out)


def versus_within(rows: pd.DataFrame, metric: str, within: str, compare: str, reference: object,
                  confidence: float = 0.95) -> pd.DataFrame:
    """Within each value of `within`, every value of `compare` against the runs with compare == reference:
    mean `metric` difference and Welch's interval over seeds (runs with state "ok").

    E.g. within="variant", compare="batch_size", reference=32: each rule at each batch size minus the
    same rule at 32; within="batch_size", compare="variant", reference="linear_warmup": each rule minus
    linear + warmup at the same batch size. Columns: within, compare, diff, low, high, n, n_reference.
    """
    parts = [versus_reference(group, metric, {compare: reference}, [within, compare], confidence)
             for _, group in rows.groupby(within, sort=False)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=[within, compare, "diff", "low", "high", "n", "n_reference"])


def versus_baseline_batch(rows: pd.DataFrame, metric: str, baseline_batch: int, rule: str = "variant",
                          batch: str = "batch_size", confidence: float = 0.95) -> pd.DataFrame:
    """Per (rule, batch size): mean `metric` minus the same rule's at `baseline_batch`, with Welch's
    interval over seeds (runs with state "ok"). Columns: rule, batch, diff, low, high, n, n_reference."""
    return versus_within(rows, metric, rule, batch, baseline_batch, confidence)


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


def markdown_table(table: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str], digits: int = 4,
                   counts: Sequence[str] = ("n",)) -> str:
    """A summarize(_states) table as Markdown: the key columns, the counts, then "mean ± std" per metric."""
    header = [*keys, *counts, *metrics]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in table.iterrows():
        cells = [str(row[k]) for k in keys] + [str(int(row[c])) for c in counts]
        for m in metrics:
            mean, std = row.get(f"{m}_mean", math.nan), row.get(f"{m}_std", math.nan)
            if not np.isfinite(mean):
                cells.append("-")
            else:
                cells.append(f"{mean:.{digits}g}" + (f" ± {std:.2g}" if np.isfinite(std) else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


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
