"""Goyal et al. (2017), "Accurate, Large Minibatch SGD": linear lr scaling with gradual warmup keeps
accuracy up to a breaking batch size. Analysis and figures; no torch import.

    test = scaling_test(rows, "linear_warmup")               # the pre-registered test (B*), verdict first
    holding_batches(rows, "linear_warmup")                     # its per-batch Welch intervals against B = 32
    lr_ceiling_test(runs, n_train=40000)                       # v4: an lr grid per B: lr ceiling or batch limit?
    table = stats.summarize_states(rows, ["variant", "batch_size"], ["test_acc"])  # rows: sweep.runs_per_variant
    verdict = breaking_batch(table, "test_acc", drop=0.01)    # secondary: where each rule breaks by the mean
    diffs = versus_baseline_batch(rows, "test_acc", 32)       # each rule at each batch minus itself at 32 (Welch)
    rule_vs_batch(ax, rows, table); difference_vs_batch(ax, rows, diffs)   # the figures

A "rule" is a spec variant (lr scaling rule and warmup); a run diverged when its state is "diverged".
Setting and pre-registered test: docs/protocols.md#goyal.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import matplotlib.transforms as mtransforms
import numpy as np
import pandas as pd

from .. import stats
from ..config import ConfigError
from ..plots import log2_batch_axis
from ..plots.sweeps import (
    axis_label,
    interval_yerr,
    plain_numbers,
    present_in_order,
    variant_colors,
)
from ..stats import versus_within, welch_interval

FINISHED = ("ok", "diverged")   # end states of a run that count (others are rerun, not dropped)


def holding_batches(rows: pd.DataFrame, rule_value: str, metric: str = "test_acc", margin: float = 0.01,
                    baseline_batch: int = 32, rule: str = "variant", batch: str = "batch_size",
                    confidence: float = 0.95) -> pd.DataFrame:
    """Per batch size of one rule: mean `metric` minus the rule's at `baseline_batch`, Welch's interval over
    the seeds that ended ok, and whether the batch size holds (docs/protocols.md#goyal): no seed diverged,
    every run finished, and the interval's lower end is above -margin. The baseline holds by definition.

    `rows`: one row per run and rule (sweep.runs_per_variant). Columns: batch, diff, low, high, n_ok,
    n_diverged, n_unfinished, holds, why; sorted by batch size.
    """
    for column in (rule, batch, metric, "state"):
        if column not in rows:
            raise ConfigError(f"holding_batches: the runs table has no column {column!r}")
    mine = rows[rows[rule] == rule_value]
    ok = mine[mine["state"] == "ok"]
    base = ok[ok[batch] == baseline_batch][metric]
    out = []
    for b, group in mine.groupby(batch, sort=True):
        d = welch_interval(group[group["state"] == "ok"][metric], base, confidence)
        n_div = int((group["state"] == "diverged").sum())
        n_unf = int((~group["state"].isin(FINISHED)).sum())
        if n_unf:
            holds, why = False, f"{n_unf} runs not finished (rerun them)"
        elif n_div:
            holds, why = False, f"{n_div} of {len(group)} seeds diverged"
        elif b == baseline_batch:
            holds, why = True, "the baseline"
        elif not math.isfinite(d.low):
            holds, why = False, f"fewer than 2 finished seeds ({d.n_a}, baseline {d.n_b})"
        elif d.low > -margin:
            holds, why = True, f"lower end {100 * d.low:+.2f} points > {-100 * margin:+.2f}"
        else:
            holds, why = False, f"lower end {100 * d.low:+.2f} points <= {-100 * margin:+.2f}"
        out.append({batch: b, "diff": d.diff, "low": d.low, "high": d.high, "n_ok": d.n_a, "n_diverged": n_div,
                    "n_unfinished": n_unf, "holds": holds, "why": why})
    return pd.DataFrame(out, columns=[batch, "diff", "low", "high", "n_ok", "n_diverged", "n_unfinished", "holds",
                                      "why"])


@dataclass(frozen=True)
class ScalingTest:
    """docs/protocols.md#goyal: B*, the largest batch size up to which a rule holds (holding_batches)."""
    rule: str
    baseline_batch: int
    b_star: float          # the largest B such that it and every smaller B hold; NaN when not testable
    first_failing: float   # the smallest B that does not hold (NaN: none fails)
    why: str               # why it fails, or why the test cannot be computed
    margin: float          # 0.01 = 1 point
    reproduced_at: int     # B* >= this: reproduced
    partly_at: int         # partly_at <= B* < reproduced_at: partly; B* below: not reproduced
    verdict: str           # reproduced | partly | not reproduced | not testable
    extend_seeds: bool     # an interval that decides B* contains -margin with < 8 seeds (protocol item 3)

    @property
    def b_star_over_base(self) -> float:
        return self.b_star / self.baseline_batch


def scaling_test(rows: pd.DataFrame, rule_value: str = "linear_warmup", metric: str = "test_acc",
                 margin: float = 0.01, baseline_batch: int = 32, reproduced_at: int = 800, partly_at: int = 80,
                 rule: str = "variant", batch: str = "batch_size") -> ScalingTest:
    """The pre-registered test of docs/protocols.md#goyal for one rule: B* from holding_batches, and the
    verdict: reproduced when B* >= reproduced_at, partly when partly_at <= B* < reproduced_at, not
    reproduced below (B* = the baseline: no larger batch holds). Not testable when a run of the rule has
    not finished, or the baseline has fewer than 2 seeds that ended ok."""
    per = holding_batches(rows, rule_value, metric, margin, baseline_batch, rule, batch)
    base = per[per[batch] == baseline_batch]

    def result(b_star: float, first: float, why: str, verdict: str, extend: bool = False) -> ScalingTest:
        return ScalingTest(rule_value, baseline_batch, b_star, first, why, margin, reproduced_at, partly_at,
                           verdict, extend)

    if not len(base) or int(base["n_ok"].iloc[0]) < 2:
        return result(math.nan, math.nan, f"fewer than 2 finished seeds at the baseline batch {baseline_batch}",
                      "not testable")
    if per["n_unfinished"].sum():
        return result(math.nan, math.nan, f"{int(per['n_unfinished'].sum())} runs not finished (rerun them)",
                      "not testable")
    if base["n_diverged"].iloc[0]:
        return result(math.nan, math.nan, "a seed diverged at the baseline batch", "not testable")
    grid = per[per[batch] >= baseline_batch]
    failing = grid[~grid["holds"]]
    first = float(failing[batch].iloc[0]) if len(failing) else math.nan
    deciding = grid if not len(failing) else grid[grid[batch] <= first]
    b_star = float(deciding[deciding["holds"]][batch].max())
    why = str(failing["why"].iloc[0]) if len(failing) else "every batch size holds"
    verdict = ("reproduced" if b_star >= reproduced_at else "partly" if b_star >= partly_at else "not reproduced")
    compared = deciding[deciding[batch] != baseline_batch]     # the baseline holds by definition
    # Seeds count where they decide: a batch beyond the first failure (e.g. one with a diverged seed) does not.
    few = int(deciding["n_ok"].min()) < 8
    extend = few and bool(((compared["low"] <= -margin) & (compared["high"] >= -margin)).any())
    return result(b_star, first, why, verdict, extend)


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


def versus_baseline_batch(rows: pd.DataFrame, metric: str, baseline_batch: int, rule: str = "variant",
                          batch: str = "batch_size", confidence: float = 0.95) -> pd.DataFrame:
    """Per (rule, batch size): mean `metric` minus the same rule's at `baseline_batch`, with Welch's
    interval over seeds (runs with state "ok"). Columns: rule, batch, diff, low, high, n, n_reference."""
    return versus_within(rows, metric, rule, batch, baseline_batch, confidence)


# ----------------------------------------------------------------------------- lr ceiling or batch limit (protocol v4)
LEARNS = 0.5            # a run "learns" when its final test accuracy is at least this (chance on 10 classes: 0.1)
PAPER_FRACTION = 8192 / 1_281_167   # Goyal's largest batch that held, as a fraction of ImageNet's training set


@dataclass(frozen=True)
class CeilingTest:
    """docs/protocols.md, Goyal's mechanism test (protocol v4): is the batch size at which the linear rule
    breaks a limit on the batch (no lr of the grid keeps the accuracy there) or an lr ceiling (a smaller lr
    does)? Batch sizes also as fractions B/N of the n_train training examples."""
    linear: ScalingTest      # scaling_test of the linear rule (the runs at lr = base_lr x B / baseline_batch)
    best: ScalingTest        # scaling_test at each batch size's best lr of the grid
    b_fail: float            # the smallest batch size at which the linear rule does not hold (NaN: none)
    fail_kind: str           # "lr ceiling" (b_fail holds at its best lr) | "batch" (it does not) | "" (no b_fail)
    n_train: int
    fraction_linear: float   # B*_linear / N
    fraction_best: float     # B*_best / N
    min_fraction: float      # B/N the paper's rule held to (Goyal: 8k of ImageNet's 1.28M)
    per_batch: pd.DataFrame  # per batch size: linear_lr, best_lr (on all seeds), n_lrs, best_at_bottom,
    #                          held_out_lrs, lr_ceiling, and the linear and held-out best-lr differences from the
    #                          baseline (linear_/best_ diff, low, high, holds)
    verdict: str             # reproduced | partly | not reproduced | not testable
    why: str
    extend_seeds: bool


def _learns(cell: pd.DataFrame, metric: str, learns: float) -> bool:
    """Every run of the cell ended ok with `metric` >= learns (a cell without runs does not learn)."""
    values = pd.to_numeric(cell[metric], errors="coerce")
    return bool(len(cell)) and bool((cell["state"] == "ok").all()) and bool((values >= learns).all())


def _held_out_best(data: pd.DataFrame, done: pd.DataFrame, metric: str, batch: str,
                   baseline_batch: int) -> tuple[pd.DataFrame, dict[float, tuple[float, ...]]]:
    """At each batch size but the baseline, every seed's run at the lr that is best on the OTHER seeds (the
    highest mean metric over them, a diverged run counting as the worst: stats.best_lr), so that no seed's
    value helped choose its own lr (the best of several lrs chosen and judged on the same seeds is biased
    upward). Returns those runs (all states: an unfinished one keeps its state) and, per batch size, the lrs
    chosen in seed order."""
    rows, chosen = [], {}
    for b in sorted(set(data[batch]) - {baseline_batch}):
        mine, finished = data[data[batch] == b], done[done[batch] == b]
        picks = []
        for seed in sorted(mine["seed"].unique()):
            others = finished[finished["seed"] != seed]
            if not len(others):
                continue
            lr_value = float(stats.best_lr(others, metric, by=batch, lr="_lr", minimize=False)["_lr"].iloc[0])
            run = mine[(mine["seed"] == seed) & np.isclose(mine["_lr"], lr_value, rtol=1e-6)]
            rows.append(run)
            picks.append(lr_value)
        chosen[float(b)] = tuple(picks)
    frame = pd.concat(rows) if rows else data.iloc[:0]
    return frame, chosen


def _finished_metric(rows: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Finished runs with the metric set to NaN for a diverged run (it counts as the worst in best_lr)."""
    done = rows[rows["state"].isin(FINISHED)]
    value = pd.to_numeric(done[metric], errors="coerce").where(done["state"] == "ok")
    return done.assign(**{metric: value})


def lr_ceiling_test(rows: pd.DataFrame, n_train: int, metric: str = "test_acc", lr: str = "effective_lr",
                    batch: str = "batch_size", base_lr: float = 0.05, baseline_batch: int = 32,
                    margin: float = 0.01, reproduced_at: int = 800, partly_at: int = 160,
                    min_fraction: float = PAPER_FRACTION, learns: float = LEARNS) -> CeilingTest:
    """Goyal's linear rule against an lr grid at every batch size, on one row per run (batch, the lr actually
    used, seed, state, metric; every run, whatever its state).

    The linear rule's runs are those at lr = base_lr x B / baseline_batch; the baseline is baseline_batch at
    base_lr. At each batch size the best lr of the grid has the highest mean metric over its seeds, a
    diverged seed counting as the worst (stats.best_lr); best_at_bottom: it is the smallest lr tried there
    (the protocol extends the grid one factor of 2 below, once). "At its best lr" is judged held out: each
    seed contributes its run at the lr that is best on the other seeds (held_out_lrs), so the choice does not
    favour the seeds that make it. B* of either is scaling_test's: the largest batch that, with every smaller
    one, holds (Welch lower end above -margin against the baseline, no seed diverged). lr_ceiling: the
    largest lr tried at that batch size whose every seed ended ok with the metric >= learns.

    Verdict (the break's kind at b_fail, the first batch size where the linear rule fails):
    reproduced: b_fail fails at its best lr too (a limit on the batch, B*_best = B*_linear) and B*_linear / N
    >= min_fraction; partly: b_fail holds at a smaller lr (an lr ceiling) but a larger batch size of the grid
    fails at every lr (the batch limit lies beyond, at B*_best / N), or the break is the batch's at B*_linear /
    N < min_fraction; not reproduced: every batch size of the grid holds at its best lr (no batch limit up to
    the largest B/N; the linear rule fails only at an lr ceiling). not testable: the linear rule's test is
    not testable, it never fails (nothing to explain), or a best lr at a batch size up to the first failing
    one at its best lr lies on the grid's bottom edge.
    """
    for column in (batch, lr, metric, "state", "seed"):
        if column not in rows:
            raise ConfigError(f"lr_ceiling_test: the runs table has no column {column!r}")
    unfinished = rows[~rows["state"].isin(FINISHED)]
    data = rows.assign(_lr=pd.to_numeric(rows[lr], errors="coerce"))
    linear_lr = base_lr * data[batch].astype(float) / baseline_batch
    on_linear = np.isclose(data["_lr"], linear_lr, rtol=1e-6)
    base = data[(data[batch] == baseline_batch) & on_linear]
    done = _finished_metric(data, metric)
    best = stats.best_lr(done[done[batch] != baseline_batch], metric, by=batch, lr="_lr", minimize=False)
    best_lr = dict(zip(best[batch], best["_lr"]))
    chosen_rows, cv_lrs = _held_out_best(data, done, metric, batch, baseline_batch)
    # unfinished runs stay in both tables, so scaling_test says "not testable" while any is pending
    linear_rows = pd.concat([base, data[on_linear & (data[batch] != baseline_batch)]]).assign(_rule="linear")
    best_rows = pd.concat([base, chosen_rows]).assign(_rule="best")
    lin = scaling_test(linear_rows, "linear", metric, margin, baseline_batch, reproduced_at, partly_at, "_rule", batch)
    top = scaling_test(best_rows, "best", metric, margin, baseline_batch, reproduced_at, partly_at, "_rule", batch)
    held_lin = holding_batches(linear_rows, "linear", metric, margin, baseline_batch, "_rule", batch).set_index(batch)
    held_top = holding_batches(best_rows, "best", metric, margin, baseline_batch, "_rule", batch).set_index(batch)
    per = []
    for b in sorted(data[batch].unique()):
        mine = done[done[batch] == b]
        tried = sorted(mine["_lr"].dropna().unique())
        learned = [v for v in tried if _learns(mine[mine["_lr"] == v], metric, learns)]
        chosen = best_lr.get(b, base_lr if b == baseline_batch else math.nan)
        row = {batch: b, "linear_lr": base_lr * b / baseline_batch, "best_lr": chosen, "n_lrs": len(tried),
               "best_at_bottom": bool(b in best_lr and len(tried) > 1 and np.isclose(chosen, tried[0])),
               "held_out_lrs": cv_lrs.get(b, ()), "lr_ceiling": float(max(learned)) if learned else math.nan}
        for name, held in (("linear", held_lin), ("best", held_top)):
            if b in held.index:
                row.update({f"{name}_diff": held.loc[b, "diff"], f"{name}_low": held.loc[b, "low"],
                            f"{name}_high": held.loc[b, "high"], f"{name}_holds": bool(held.loc[b, "holds"])})
        per.append(row)
    per_batch = pd.DataFrame(per)
    b_fail = lin.first_failing
    fail_kind = "" if not math.isfinite(b_fail) or b_fail not in held_top.index else (
        "lr ceiling" if bool(held_top.loc[b_fail, "holds"]) else "batch")
    fraction_lin, fraction_top = lin.b_star / n_train, top.b_star / n_train
    deciding_top = per_batch[per_batch[batch] <= (top.first_failing if math.isfinite(top.first_failing)
                                                  else per_batch[batch].max())]
    at_bottom = deciding_top.loc[deciding_top["best_at_bottom"].astype(bool), batch].tolist()
    if len(unfinished):
        verdict, why = "not testable", f"{len(unfinished)} runs not finished (rerun them)"
    elif lin.verdict == "not testable":
        verdict, why = "not testable", f"the linear rule's test is not testable ({lin.why})"
    elif not math.isfinite(b_fail):
        verdict, why = "not testable", "the linear rule holds at every batch size of the grid: no break to explain"
    elif at_bottom:
        verdict, why = "not testable", (f"the best lr is the grid's smallest at B = {', '.join(map(str, at_bottom))} "
                                        f"(extend the grid one factor of 2 below, once)")
    elif fail_kind == "batch":
        if fraction_lin >= min_fraction:
            verdict, why = "reproduced", (f"B = {b_fail:g} fails at every lr of the grid (a batch limit); B*/N = "
                                          f"{fraction_lin:.3g} >= {min_fraction:.3g}")
        else:
            verdict, why = "partly", (f"B = {b_fail:g} fails at every lr of the grid, but B*/N = {fraction_lin:.3g} "
                                      f"< {min_fraction:.3g}")
    elif math.isfinite(top.first_failing):
        verdict, why = "partly", (f"B = {b_fail:g} holds at lr {best_lr[b_fail]:g} < the linear "
                                  f"{base_lr * b_fail / baseline_batch:g} (an lr ceiling); the batch limit is at B = "
                                  f"{top.first_failing:g} (B*_best/N = {fraction_top:.3g})")
    else:
        verdict, why = "not reproduced", (f"B = {b_fail:g} holds at lr {best_lr[b_fail]:g} (an lr ceiling) and every "
                                          f"batch size holds at its best lr: no batch limit up to B/N = "
                                          f"{per_batch[batch].max() / n_train:.3g}")
    extend = verdict != "not testable" and (lin.extend_seeds or top.extend_seeds)
    return CeilingTest(lin, top, b_fail, fail_kind, n_train, fraction_lin, fraction_top, min_fraction, per_batch,
                       verdict, why, extend)


# ----------------------------------------------------------------------------- figures
def rule_vs_batch(ax: plt.Axes, rows: pd.DataFrame, table: pd.DataFrame, y: str = "test_acc",
                  hue: str = "variant", order: Sequence[str] | None = None, log_y: bool = False,
                  colors: dict[str, tuple] | None = None) -> plt.Axes:
    """Mean `y` over seeds against batch size (log2 axis), one line per rule (`hue`), with t-intervals.

    `rows`: one row per run and rule (sweep.runs_per_variant), for the seeds (state ok) and the
    diverged runs (an x at the bottom, in the rule's colour); `table`: stats.summarize_states by
    (hue, batch_size) with `y` among its metrics. The x positions are offset slightly per rule so the
    bars do not hide each other. `colors`: hue value -> colour (default: variant_colors of the order).
    """
    names = present_in_order(table[hue], order)
    colors = colors or variant_colors(names)
    bottom = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    handles: list[Any] = []
    for i, name in enumerate(names):
        shift = 2 ** (0.04 * (i - (len(names) - 1) / 2))  # a few percent along the log2 axis
        part = table[(table[hue] == name) & (table["n"] > 0)].sort_values("batch_size")
        if len(part):
            handles.append(ax.errorbar(part["batch_size"] * shift, part[f"{y}_mean"], yerr=interval_yerr(part, y),
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
        plain_numbers(ax)
    shown = table[table[hue].isin(names)]
    seeds = rows[(rows["state"] == "ok") & rows[hue].isin(names)][y]
    limits_from_intervals(ax, [shown[f"{y}_low"], shown[f"{y}_mean"], seeds], [shown[f"{y}_high"], seeds], log_y)
    ax.set(xlabel=axis_label("batch_size"), ylabel=axis_label(y))
    ax.legend(handles=handles, fontsize="small")
    return ax


def limits_from_intervals(ax: plt.Axes, lows: Sequence[Any], highs: Sequence[Any], log: bool = False,
                          pad: float = 0.06) -> None:
    """Set the y limits so every finite value of `lows` and `highs` (interval ends, points) lies inside
    the axes, padded by `pad` of the range (of the log range on a log axis)."""
    lo = np.concatenate([np.asarray(v, dtype=float).ravel() for v in lows])
    hi = np.concatenate([np.asarray(v, dtype=float).ravel() for v in highs])
    values = np.concatenate([lo, hi])
    values = values[np.isfinite(values) & ((values > 0) if log else True)]
    if not len(values):
        return
    bottom, top = float(values.min()), float(values.max())
    if log:
        span = math.log10(top / bottom) if top > bottom else 1.0
        ax.set_ylim(bottom / 10 ** (pad * span), top * 10 ** (pad * span))
    else:
        span = top - bottom if top > bottom else max(abs(top), 1e-3)
        ax.set_ylim(bottom - pad * span, top + pad * span)


def threshold_axis(ax: plt.Axes, margin_points: float, color: object, label: str) -> None:
    """A difference axis in points that keeps a -margin threshold readable beside a collapse of tens of
    points: a grey line at 0, the dotted threshold at -margin_points, and a symmetric-log scale, linear within
    2 margins of 0, with plain tick labels. Set the limits after this call (a new scale resets them)."""
    ax.axhline(0.0, color="0.7", linewidth=0.8)
    ax.axhline(-margin_points, color=color, linestyle=":", linewidth=1.2, label=label)
    ax.set_yscale("symlog", linthresh=2 * margin_points, linscale=1.5)
    ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))


def difference_vs_batch(ax: plt.Axes, rows: pd.DataFrame, diffs: pd.DataFrame, margin: float = 0.01,
                        hue: str = "variant", order: Sequence[str] | None = None,
                        colors: dict[str, tuple] | None = None, baseline_batch: int = 32) -> plt.Axes:
    """Each rule's mean metric minus its own at `baseline_batch` (versus_baseline_batch), in percentage
    points, with Welch's 95% interval, against batch size (log2 axis); one dotted line at -margin, the
    threshold of "holds" (docs/protocols.md#goyal), which applies to every rule because each is measured
    from its own baseline. Diverged seeds: an x at the bottom in the rule's colour. Limits from the
    intervals, so every bar lies inside the axes. The y axis is symmetric-log, linear within 2 margins of 0,
    so that the threshold stays readable beside a collapse of tens of points."""
    names = present_in_order(diffs[hue], order)
    colors = colors or variant_colors(names)
    bottom = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    ends: list[Any] = []
    for i, name in enumerate(names):
        shift = 2 ** (0.04 * (i - (len(names) - 1) / 2))
        part = diffs[(diffs[hue] == name) & diffs["diff"].notna()].sort_values("batch_size")
        y, low, high = 100 * part["diff"], 100 * part["low"], 100 * part["high"]
        err = np.vstack([np.nan_to_num(y - low), np.nan_to_num(high - y)])
        ax.errorbar(part["batch_size"] * shift, y, yerr=err, marker="o", ms=4, capsize=2, color=colors[name],
                    label=name)
        ends += [low, high, y]
        diverged = rows[(rows[hue] == name) & (rows["state"] == "diverged")]
        if len(diverged):
            ax.scatter(diverged["batch_size"] * shift, np.full(len(diverged), 0.03), marker="x", s=30,
                       color=colors[name], transform=bottom, zorder=4, clip_on=False, label=f"_diverged {name}")
    threshold_axis(ax, 100 * margin, "0.3", f"-{100 * margin:g} point: holds above (lower end)")
    limits_from_intervals(ax, ends + [[-100 * margin]], ends + [[0.0]])
    log2_batch_axis(ax, "x", [int(b) for b in diffs["batch_size"].unique()])
    ax.set(xlabel=axis_label("batch_size"), ylabel=f"test acc. - same rule at B={baseline_batch} (points)")
    ax.legend(fontsize="x-small")
    return ax


def curves_by_batch(ax: plt.Axes, history: pd.DataFrame, y: str = "train_loss", x: str = "epoch",
                    hue: str = "batch_size", log_y: bool = True, colors: dict[Any, Any] | None = None,
                    confidence: float = 0.95) -> plt.Axes:
    """`y` against `x` from a long-form history, one line per `hue` value (batch size): the mean over seeds
    at each evaluation and a band of its Student-t interval over seeds (stats.t_interval; no band where
    only one seed is left). `colors`: hue value -> colour (default: viridis by rank)."""
    from ..stats import t_interval
    values = sorted(history[hue].dropna().unique())
    cmap = plt.get_cmap("viridis")
    colors = colors or {v: cmap(i / max(len(values) - 1, 1)) for i, v in enumerate(values)}
    for v in values:
        rows = []
        for at, group in history[history[hue] == v].groupby(x, sort=True):
            mean, _, low, high = t_interval(group[y], confidence)
            rows.append((at, mean, low, high))
        curve = pd.DataFrame(rows, columns=[x, "mean", "low", "high"])
        label = f"{v:g}" if isinstance(v, (int, float, np.number)) else str(v)
        ax.plot(curve[x], curve["mean"], color=colors[v], label=label, linewidth=1.2)
        ax.fill_between(curve[x], curve["low"], curve["high"], color=colors[v], alpha=0.2, linewidth=0)
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel=axis_label(x), ylabel=axis_label(y))
    return ax


def ceiling_plot(ax_diff: plt.Axes, ax_lr: plt.Axes, test: CeilingTest, batch: str = "batch_size") -> None:
    """The mechanism test as the eye should read it. Left: test accuracy minus the baseline's (points, Welch 95%
    interval) against batch size, at the linear rule's lr and at each batch size's held-out best lr, with the
    -margin threshold on a symmetric-log axis (linear within 2 margins), and B/N on a top axis. Right: the lrs
    against batch size on log-log axes: the linear rule's, the best of the grid (hollow where it is the
    grid's smallest) and the lr ceiling (the largest lr at which every seed learns)."""
    per = test.per_batch.sort_values(batch)
    b = per[batch].to_numpy(float)
    margin = 100 * test.linear.margin
    for i, (name, label) in enumerate([("linear", "linear rule's lr"), ("best", "held-out best lr of the grid")]):
        if f"{name}_diff" not in per:
            continue
        y, low, high = (100 * per[f"{name}_{c}"].to_numpy(float) for c in ("diff", "low", "high"))
        shift = 2 ** (0.03 * (2 * i - 1))
        ax_diff.errorbar(b * shift, y, yerr=np.vstack([np.nan_to_num(y - low), np.nan_to_num(high - y)]), fmt="o-",
                         ms=4, capsize=2, color=f"C{i}", label=label)
    threshold_axis(ax_diff, margin, "C3", f"-{margin:g} point: holds above")
    log2_batch_axis(ax_diff, "x", [int(v) for v in b])
    ax_diff.set(xlabel=axis_label(batch), ylabel=f"test acc. - B={test.linear.baseline_batch} (points)")
    n = float(test.n_train)
    top = ax_diff.secondary_xaxis("top", functions=(lambda x: np.asarray(x, float) / n,
                                                    lambda f: np.asarray(f, float) * n))
    top.set_xticks(b / n, [f"{v:.2g}" for v in b / n])
    top.xaxis.set_minor_locator(mticker.NullLocator())
    top.set_xlabel("B / N")
    ax_diff.legend(fontsize="x-small")
    base = test.linear.baseline_batch
    base_lr = float(per.loc[per[batch] == base, "linear_lr"].iloc[0]) if (per[batch] == base).any() else math.nan
    ax_lr.plot(b, per["linear_lr"], "--", color="0.5", label=f"linear rule: {base_lr:g} B/{base}")
    bottom = per["best_at_bottom"].astype(bool).to_numpy()
    ax_lr.plot(b[~bottom], per["best_lr"].to_numpy(float)[~bottom], "o", color="C1", label="best lr (all seeds)")
    if bottom.any():
        ax_lr.plot(b[bottom], per["best_lr"].to_numpy(float)[bottom], "o", mfc="white", color="C1",
                   label="best lr, the grid's smallest")
    ax_lr.plot(b, per["lr_ceiling"], "v", color="C3", label="lr ceiling: largest lr at which every seed learns")
    ax_lr.set_yscale("log")
    log2_batch_axis(ax_lr, "x", [int(v) for v in b])
    ax_lr.set(xlabel=axis_label(batch), ylabel="learning rate")
    ax_lr.legend(fontsize="x-small")
