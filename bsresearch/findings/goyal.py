"""Goyal et al. (2017), "Accurate, Large Minibatch SGD": linear lr scaling with gradual warmup keeps
accuracy up to a breaking batch size. No torch import.

    test = scaling_test(rows, "linear_warmup")               # the pre-registered test (B*), verdict first
    holding_batches(rows, "linear_warmup")                     # its per-batch Welch intervals against B = 32
    lr_ceiling_test(runs, n_train=40000)                       # v4: an lr grid per B: lr ceiling or batch limit?
    table = stats.summarize_states(rows, ["variant", "batch_size"], ["test_acc"])  # rows: sweep.runs_per_variant
    verdict = breaking_batch(table, "test_acc", drop=0.01)    # secondary: where each rule breaks by the mean
    diffs = versus_baseline_batch(rows, "test_acc", 32)       # each rule at each batch minus itself at 32 (Welch)
    figures.rule_vs_batch(ax, rows, table); figures.difference_vs_batch(ax, rows, diffs)   # the figures

A "rule" is a spec variant (lr scaling rule and warmup); a run diverged when its state is "diverged".
Setting and pre-registered test: docs/protocols.md#goyal.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.goyal (`figures` above).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import stats
from ..config import ConfigError
from ..rundir import FINISHED_STATES as FINISHED  # the end states of a run that count (others are rerun)
from ..stats import versus_within, welch_interval
from .verdict import PreregisteredTest, Verdict


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
class ScalingTest(PreregisteredTest):
    """docs/protocols.md#goyal: B*, the largest batch size up to which a rule holds (holding_batches)."""
    rule: str
    baseline_batch: int
    b_star: float          # the largest B such that it and every smaller B hold; NaN when not testable
    first_failing: float   # the smallest B that does not hold (NaN: none fails)
    why: str               # why it fails, or why the test cannot be computed
    margin: float          # 0.01 = 1 point
    reproduced_at: int     # B* >= this: reproduced
    partly_at: int         # partly_at <= B* < reproduced_at: partly; B* below: not reproduced
    verdict: Verdict
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

    def result(b_star: float, first: float, why: str, verdict: Verdict, extend: bool = False) -> ScalingTest:
        return ScalingTest(rule_value, baseline_batch, b_star, first, why, margin, reproduced_at, partly_at,
                           verdict, extend)

    if not len(base) or int(base["n_ok"].iloc[0]) < 2:
        return result(math.nan, math.nan, f"fewer than 2 finished seeds at the baseline batch {baseline_batch}",
                      Verdict.NOT_TESTABLE)
    if per["n_unfinished"].sum():
        return result(math.nan, math.nan, f"{int(per['n_unfinished'].sum())} runs not finished (rerun them)",
                      Verdict.NOT_TESTABLE)
    if base["n_diverged"].iloc[0]:
        return result(math.nan, math.nan, "a seed diverged at the baseline batch", Verdict.NOT_TESTABLE)
    grid = per[per[batch] >= baseline_batch]
    failing = grid[~grid["holds"]]
    first = float(failing[batch].iloc[0]) if len(failing) else math.nan
    deciding = grid if not len(failing) else grid[grid[batch] <= first]
    b_star = float(deciding[deciding["holds"]][batch].max())
    why = str(failing["why"].iloc[0]) if len(failing) else "every batch size holds"
    verdict = (Verdict.REPRODUCED if b_star >= reproduced_at else Verdict.PARTLY if b_star >= partly_at
               else Verdict.NOT_REPRODUCED)
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
class CeilingTest(PreregisteredTest):
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
    verdict: Verdict
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
        verdict, why = Verdict.NOT_TESTABLE, f"{len(unfinished)} runs not finished (rerun them)"
    elif lin.verdict == Verdict.NOT_TESTABLE:
        verdict, why = Verdict.NOT_TESTABLE, f"the linear rule's test is not testable ({lin.why})"
    elif not math.isfinite(b_fail):
        verdict, why = (Verdict.NOT_TESTABLE,
                        "the linear rule holds at every batch size of the grid: no break to explain")
    elif at_bottom:
        verdict, why = Verdict.NOT_TESTABLE, (f"the best lr is the grid's smallest at B = "
                                              f"{', '.join(map(str, at_bottom))} "
                                              f"(extend the grid one factor of 2 below, once)")
    elif fail_kind == "batch":
        if fraction_lin >= min_fraction:
            verdict, why = Verdict.REPRODUCED, (f"B = {b_fail:g} fails at every lr of the grid (a batch limit); B*/N = "
                                                f"{fraction_lin:.3g} >= {min_fraction:.3g}")
        else:
            verdict, why = Verdict.PARTLY, (f"B = {b_fail:g} fails at every lr of the grid, but B*/N = "
                                            f"{fraction_lin:.3g} < {min_fraction:.3g}")
    elif math.isfinite(top.first_failing):
        verdict, why = Verdict.PARTLY, (f"B = {b_fail:g} holds at lr {best_lr[b_fail]:g} < the linear "
                                        f"{base_lr * b_fail / baseline_batch:g} (an lr ceiling); the batch limit is "
                                        f"at B = {top.first_failing:g} (B*_best/N = {fraction_top:.3g})")
    else:
        verdict, why = Verdict.NOT_REPRODUCED, (f"B = {b_fail:g} holds at lr {best_lr[b_fail]:g} (an lr ceiling) "
                                                f"and every batch size holds at its best lr: no batch limit up to "
                                                f"B/N = {per_batch[batch].max() / n_train:.3g}")
    extend = verdict != Verdict.NOT_TESTABLE and (lin.extend_seeds or top.extend_seeds)
    return CeilingTest(lin, top, b_fail, fail_kind, n_train, fraction_lin, fraction_top, min_fraction, per_batch,
                       verdict, why, extend)
