"""Statistics over seeds, shared by every analysis: t intervals, Welch differences, group summaries, the
best learning rate per group and Markdown tables. No torch import (numpy, scipy, pandas only).

    summarize(runs, "batch_size", ["test_acc"])               # n, mean, std, t interval per group
    summarize_states(rows, ["variant", "batch_size"], [...])  # the same over ok runs, + n_ok, n_diverged
    welch_interval(a, b)                                      # mean(a) - mean(b), Welch's t interval
    versus_reference(rows, "test_acc", {"variant": "sb"})     # each group minus a reference group
    best_lr(runs, "steps_to_target")                          # per batch size, the lr with the best mean
    markdown_table(table, ["variant"], ["test_acc"])          # "mean ± std" cells

Intervals are over seeds (independent runs), two-sided, at `confidence` (0.95 by default).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

LOWER_IS_BETTER = ("loss", "steps", "examples", "epochs", "gap", "seconds", "sharpness")


def t_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, std, low, high): the Student-t interval of the mean of `values` (NaN values dropped);
    std, low and high are NaN with fewer than two values."""
    from scipy import stats
    v = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").dropna().to_numpy(float)
    mean = float(v.mean()) if len(v) else math.nan
    if len(v) < 2:
        return mean, math.nan, math.nan, math.nan
    std = float(v.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, len(v) - 1) * std / math.sqrt(len(v)))
    return mean, std, mean - half, mean + half


def summarize(runs: pd.DataFrame, by: str | Sequence[str], metrics: Sequence[str],
              confidence: float = 0.95) -> pd.DataFrame:
    """Per group (e.g. batch size): n, and for each metric its mean, std, and the Student-t interval of
    the mean over seeds (`<metric>_mean`, `_std`, `_low`, `_high`). NaN values (e.g. never reached the
    target) are left out of that metric's statistics."""
    by = [by] if isinstance(by, str) else list(by)
    rows = []
    for key, group in runs.groupby(by, sort=True, dropna=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row["n"] = len(group)
        for m in metrics:
            mean, std, low, high = t_interval(group[m], confidence)
            row.update({f"{m}_mean": mean, f"{m}_std": std, f"{m}_low": low, f"{m}_high": high})
        rows.append(row)
    return pd.DataFrame(rows)


def summarize_states(rows: pd.DataFrame, by: str | Sequence[str], metrics: Sequence[str],
                     confidence: float = 0.95) -> pd.DataFrame:
    """summarize over the runs that ended "ok", plus per group n_runs, n_ok, n_diverged and
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


def lower_is_better(metric: str) -> bool:
    """Losses, steps, examples, epochs, gaps, seconds and sharpness are minimised; the rest maximised."""
    return any(word in metric for word in LOWER_IS_BETTER)


def best_lr(runs: pd.DataFrame, metric: str, by: str | Sequence[str] = "batch_size", lr: str = "lr",
            minimize: bool | None = None) -> pd.DataFrame:
    """For each group (batch size), the learning rate with the best mean `metric` over seeds.

    A run with a missing value (diverged, never reached the target) counts as the worst possible, so an
    lr that fails for some seed is not chosen over one that always works. Columns: the `by` columns,
    lr, `<metric>` (mean over seeds at that lr), n_seeds, n_lrs, and `interior`: whether the best lr lies
    strictly inside the lrs tried (if not, extend the grid: the optimum may lie beyond it).
    """
    by = [by] if isinstance(by, str) else list(by)
    minimize = lower_is_better(metric) if minimize is None else minimize
    worst = math.inf if minimize else -math.inf
    scores = runs.assign(_score=pd.to_numeric(runs[metric], errors="coerce").fillna(worst))
    per_lr = scores.groupby(by + [lr], sort=True)["_score"].agg(["mean", "size"]).reset_index()
    rows = []
    for key, group in per_lr.groupby(by, sort=True):
        best = group.loc[group["mean"].idxmin() if minimize else group["mean"].idxmax()]
        lrs = sorted(group[lr])
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update({lr: best[lr], metric: best["mean"] if math.isfinite(best["mean"]) else math.nan,
                    "n_seeds": int(best["size"]), "n_lrs": len(lrs),
                    "interior": len(lrs) > 2 and lrs[0] < best[lr] < lrs[-1]})
        rows.append(row)
    return pd.DataFrame(rows, columns=[*by, lr, metric, "n_seeds", "n_lrs", "interior"])   # no runs: no rows


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


# ----------------------------------------------------------------------------- tables
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


def frame_markdown(table: pd.DataFrame, digits: int = 4) -> str:
    """Any table as Markdown, cell by cell: floats to `digits` significant digits, NaN as "-"."""
    def cell(value: object) -> str:
        if isinstance(value, (float, np.floating)):
            return "-" if not np.isfinite(value) else f"{value:.{digits}g}"
        return str(value)
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"
