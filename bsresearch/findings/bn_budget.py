"""B/N, B/B_crit or the step budget: which one predicts the large-batch break (Goyal) and the large-batch gap
(Hoffer)? Protocol version 5 (docs/protocols.md#bn-budget). No torch import.

    bcrit = critical_batch_by_n(stt_runs)                   # per N: B_crit by the steps-to-target rules
    ratio = bcrit_shift(bcrit)                              # c = log2 B_crit(N_large) / B_crit(N_small), interval
    table = goyal_breaks(goyal_runs)                        # per (N, arm): the break at the held-out best lr
    valid = valid_at_ends(bcrit)                            # B/B_crit can be tested (B_crit valid at both ends)
    test = break_test(table, ratio, bcrit_valid=valid)      # which predicts Goyal's break, and the verdict
    gap = gap_test(hoffer_gaps(hoffer_runs), ratio, bcrit_valid=valid)   # which predicts Hoffer's gap
    v6 = predictor_gap_test(hoffer_v6_runs, ratio)         # version 6: steps at one N, B/N at fixed steps

Three explanations of where large batches start to lose, and what each predicts when N grows 4x (10 000 to
40 000) with the batch grid fixed: B/N: the break moves up 4x (2 octaves), and the gap at one B shrinks;
B/B_crit: the break moves with B_crit (measured at each N), and the gap at one B stays; steps: the break and
the gap go away when every batch size gets the same number of steps. Arms: `epochs` (every run the same
epochs) and `steps` (every run the same steps).

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.bn_budget.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from .. import results, stats
from ..config import ConfigError
from ..paths import project_path
from ..rundir import FINISHED_STATES as FINISHED  # the end states of a run that count (others are rerun)
from ..stats import welch_interval
from . import goyal
from .adam_vs_sgd import CriticalBatchRatio, critical_batch_ratio
from .steps_to_target import at_best_lr, fit_points, tuned_table
from .verdict import PreregisteredTest, Verdict

ARMS = ("epochs", "steps")
MARGIN = 0.01              # 1 point, the margin of versions 1-4 for Goyal and Hoffer
SEPARABLE = 1.0            # B/N and B/B_crit are told apart only when |log2 B_crit shift| < this (octaves)
B_OVER_N_SHIFT = 2.0       # octaves the break moves under B/N when N grows 4x


def _n_column(runs: pd.DataFrame) -> str:
    for column in ("train_size", "n_train"):
        if column in runs and runs[column].notna().all():
            return column
    raise ConfigError("bn_budget: the runs table has no train_size (or n_train) for every run")


# ----------------------------------------------------------------------------- B_crit at each N
def critical_batch_by_n(runs: pd.DataFrame, steps: str = "steps_to_target", min_batches: int = 6) -> pd.DataFrame:
    """Per N: the best lr per batch size (fewest mean steps over the seeds, a run that missed counting as the
    worst: steps_to_target.tuned_table), the fit S = S_min (1 + B_crit/B) to every seed at it (a run that
    missed is left out; a batch size with fewer than 3 seeds at the target leaves the fit), and its validity
    (every best lr interior, at least `min_batches` batch sizes in the fit). Columns: n, b_crit, b_crit_low,
    b_crit_high, n_batches, all_interior, valid, fit (the CriticalBatchFit)."""
    n_col = _n_column(runs)
    rows = []
    for n, g in runs.groupby(n_col, sort=True):
        tuned = tuned_table(g, steps=steps)
        points, counts = fit_points(at_best_lr(g, tuned), steps=steps)
        n_batches = int(counts["in_fit"].sum())
        fit = results.critical_batch(points, steps=steps, batch="batch_size") if n_batches >= 2 else None
        interior = bool(tuned["interior"].all())
        rows.append({"n": int(n), "b_crit": fit.b_crit if fit else math.nan,
                     "b_crit_low": fit.b_crit_interval[0] if fit else math.nan,
                     "b_crit_high": fit.b_crit_interval[1] if fit else math.nan,
                     "n_batches": n_batches, "all_interior": interior,
                     "valid": bool(fit is not None and interior and n_batches >= min_batches), "fit": fit})
    return pd.DataFrame(rows)


def bcrit_shift(bcrit: pd.DataFrame) -> CriticalBatchRatio:
    """B_crit at the largest N over B_crit at the smallest, with its interval on the log scale (the two fits
    are independent runs: adam_vs_sgd.critical_batch_ratio)."""
    table = bcrit.sort_values("n")
    small, large = table.iloc[0]["fit"], table.iloc[-1]["fit"]
    if small is None or large is None:
        raise ConfigError("bcrit_shift: a B_crit fit is missing")
    return critical_batch_ratio(large, small)


def valid_at_ends(bcrit: pd.DataFrame) -> bool:
    """B/B_crit can be tested (protocol v5; v6's own-setting c too): B_crit is valid at the smallest and the
    largest N, the two that c reads (a table's `valid` column, by N)."""
    table = bcrit.sort_values("n")
    return len(table) >= 2 and bool(table["valid"].iloc[[0, -1]].all())


def octaves(ratio: CriticalBatchRatio) -> tuple[float, float, float]:
    """c = log2 of B_crit's ratio, with its interval (octaves)."""
    return math.log2(ratio.ratio), math.log2(ratio.low), math.log2(ratio.high)


def separable(ratio: CriticalBatchRatio, limit: float = SEPARABLE) -> bool:
    """B/N and B/B_crit make different predictions: B_crit's shift c (octaves) has its interval inside
    (-limit, +limit) while B/N shifts by 2 octaves."""
    _, low, high = octaves(ratio)
    return math.isfinite(low) and -limit < low and high < limit


# ----------------------------------------------------------------------------- Goyal: the break
def goyal_breaks(rows: pd.DataFrame, arm: str = "arm", metric: str = "test_acc", lr: str = "effective_lr",
                 base_lr: float = 0.05, baseline_batch: int = 32, margin: float = MARGIN) -> pd.DataFrame:
    """Per (N, arm): goyal.lr_ceiling_test on that arm's runs plus the N's baseline (batch `baseline_batch` at
    `base_lr`, shared by the arms). b_break: the smallest batch size that fails at its held-out best lr of
    the grid (inf: every batch size holds); b_linear: the same at the linear lr; problems: unfinished runs,
    a deciding best lr on the grid's bottom edge; extend_seeds: a deciding interval contains -margin."""
    n_col = _n_column(rows)
    out = []
    for n, g in rows.groupby(n_col, sort=True):
        base = g[g["batch_size"] == baseline_batch]
        for a in sorted(set(g[arm].dropna()) - {""}):
            mine = pd.concat([base, g[(g[arm] == a) & (g["batch_size"] != baseline_batch)]])
            test = goyal.lr_ceiling_test(mine, int(n), metric, lr, base_lr=base_lr, baseline_batch=baseline_batch,
                                         margin=margin)
            top = test.best
            problems = []
            unfinished = int((~mine["state"].isin(FINISHED)).sum())
            if unfinished:
                problems.append(f"{unfinished} runs not finished")
            limit = top.first_failing if math.isfinite(top.first_failing) else test.per_batch["batch_size"].max()
            deciding = test.per_batch[test.per_batch["batch_size"] <= limit]
            edge = deciding.loc[deciding["best_at_bottom"].astype(bool), "batch_size"].tolist()
            if edge:
                problems.append(f"best lr on the grid's bottom edge at B = {', '.join(f'{b:g}' for b in edge)}")
            out.append({"n": int(n), "arm": a,
                        "b_break": top.first_failing if math.isfinite(top.first_failing) else math.inf,
                        "b_star": top.b_star,
                        "b_linear": test.linear.first_failing if math.isfinite(test.linear.first_failing)
                        else math.inf,
                        "largest": float(mine["batch_size"].max()), "problems": tuple(problems),
                        "extend_seeds": bool(top.extend_seeds)})
    return pd.DataFrame(out)


def break_cells(rows: pd.DataFrame, arm: str = "arm", metric: str = "test_acc", lr: str = "effective_lr",
                baseline_batch: int = 32, confidence: float = 0.95) -> pd.DataFrame:
    """The break test's cells, one row per (N, arm, B, lr): runs, ok, diverged and unfinished counts, the mean and
    std of `metric` over the ok runs, and its Welch difference from that N's baseline (batch `baseline_batch`)
    with the interval (fraction); `best` marks the lr best on all seeds at that (N, arm, B) (highest mean, a
    diverged run counting as the worst, as the test chooses before holding each seed out), `bottom` the grid's
    smallest lr there. What goyal_breaks decides from, cell by cell."""
    n_col = _n_column(rows)
    out = []
    for n, g in rows.groupby(n_col, sort=True):
        base = pd.to_numeric(g[(g["batch_size"] == baseline_batch) & (g["state"] == "ok")][metric], errors="coerce")
        for (a, b), cell_group in g[g["batch_size"] != baseline_batch].groupby([arm, "batch_size"], sort=True):
            done = goyal._finished_metric(cell_group, metric)
            best = float(stats.best_lr(done, metric, by="batch_size", lr=lr, minimize=False)[lr].iloc[0]) \
                if len(done) else math.nan
            bottom = float(cell_group[lr].min())
            for rate, cell in cell_group.groupby(lr, sort=True):
                ok = pd.to_numeric(cell[cell["state"] == "ok"][metric], errors="coerce").dropna()
                d = welch_interval(ok, base, confidence)
                out.append({"n": int(n), "arm": a, "batch_size": int(b), "lr": float(rate), "runs": len(cell),
                            "ok": len(ok), "diverged": int((cell["state"] == "diverged").sum()),
                            "unfinished": int((~cell["state"].isin(FINISHED)).sum()),
                            "mean": float(ok.mean()) if len(ok) else math.nan,
                            "std": float(ok.std(ddof=1)) if len(ok) > 1 else math.nan,
                            "diff": d.diff, "low": d.low, "high": d.high,
                            "best": bool(np.isclose(rate, best, rtol=1e-6)), "bottom": float(rate) == bottom})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class PredictorTest(PreregisteredTest):
    """Which of B/N, B/B_crit or the step budget predicts a large-batch effect (protocol v5)."""
    effect: str                  # "break" (Goyal) or "gap" (Hoffer)
    predictor: str               # "B/N" | "B/B_crit" | "steps" | "none" | "undecided"
    shift: float                 # break: octaves the break moves from the smallest to the largest N (steps arm);
    #                              gap: T = gap(largest N) - gap(smallest N) at equal steps (fraction)
    shift_low: float             # gap: T's interval; break: the shift's lower bound (a censored break)
    shift_high: float
    c: float                     # B_crit's shift over the same N, octaves, with its interval
    c_low: float
    c_high: float
    separable: bool
    table: pd.DataFrame          # per (N, arm): the break or the gaps
    verdict: Verdict
    why: str
    extend_seeds: bool
    problems: tuple[str, ...] = ()


def break_test(breaks: pd.DataFrame, ratio: CriticalBatchRatio, *, bcrit_valid: bool) -> PredictorTest:
    """Goyal's break. steps: the epochs arm breaks at every N and the steps arm at none. Otherwise, from the
    steps arm's break at the smallest and largest N, s = log2 b(N_large)/b(N_small) (a break beyond the grid
    at N_large: s >= log2(2 B_max / b(N_small))): B/N when s = 2, B/B_crit when |s - c| < 1, none otherwise.
    Verdict (Goyal's rule read as a limit in B/N, as in v4): B/N reproduced, B/B_crit partly, steps or none
    not reproduced; undecided (B/N and B/B_crit not separable, or both fit) inconclusive. Without a valid
    B_crit at the smallest and largest N (`bcrit_valid`: valid_at_ends) B/B_crit is not testable: the predictor
    is steps, B/N ("the break follows N", its alternative untested) or undecided."""
    c, c_low, c_high = octaves(ratio)
    sep = bcrit_valid and separable(ratio)
    problems = [f"N = {r.n} {r.arm}: {p}" for r in breaks.itertuples() for p in r.problems]
    if set(breaks["arm"]) != set(ARMS):
        problems.append(f"arms {sorted(set(breaks['arm']))}, not {list(ARMS)}")
    extend = bool(breaks["extend_seeds"].any())
    ns = sorted(breaks["n"].unique())
    arm = {a: breaks[breaks["arm"] == a].set_index("n")["b_break"] for a in set(breaks["arm"])}
    epochs, steps = arm.get("epochs", pd.Series(dtype=float)), arm.get("steps", pd.Series(dtype=float))
    if not problems and not np.isfinite(epochs).any():
        problems.append("the epochs arm breaks at no N: no break to explain")
    shift = low = high = math.nan
    if problems:
        return PredictorTest("break", "undecided", shift, low, high, c, c_low, c_high, sep, breaks,
                             Verdict.NOT_TESTABLE, "; ".join(problems), extend, tuple(problems))
    if np.isfinite(epochs).all() and not np.isfinite(steps).any():
        predictor, why = "steps", "the epochs arm breaks at every N; with equal steps no batch size breaks"
    else:
        b_small, b_large = steps[ns[0]], steps[ns[-1]]
        largest = float(breaks["largest"].max())
        if not math.isfinite(b_small):
            predictor, why = "none", (f"with equal steps the break is at N = {ns[-1]} (B = {b_large:g}) but not at "
                                      f"N = {ns[0]}: it moves against N")
        else:
            censored = not math.isfinite(b_large)
            shift = math.log2((2 * largest if censored else b_large) / b_small)
            low, high = shift, (math.inf if censored else shift)
            fits_bn = (low <= B_OVER_N_SHIFT <= high) if censored else abs(shift - B_OVER_N_SHIFT) < 0.5
            fits_bc = (low - c) < 1 if censored else abs(shift - c) < 1
            if not bcrit_valid:
                predictor = "B/N" if fits_bn else "undecided"
                why = (f"with equal steps the break moves {shift:+g} octaves as N grows 4x (B/N: +2); B_crit is not "
                       f"valid at the smallest or largest N, so B/B_crit is not tested")
            elif not sep:
                predictor, why = "undecided", (f"B_crit moves {c:+.2f} octaves [{c_low:+.2f}, {c_high:+.2f}]: B/N and "
                                               f"B/B_crit are not separable")
            elif fits_bn and not fits_bc:
                predictor = "B/N"
                why = f"with equal steps the break moves {shift:+g} octaves as N grows 4x (B/N: +2; B_crit: {c:+.2f})"
            elif fits_bc and not fits_bn:
                predictor = "B/B_crit"
                why = f"with equal steps the break moves {shift:+g} octaves, as B_crit ({c:+.2f}); B/N predicts +2"
            elif fits_bc and fits_bn:
                predictor, why = "undecided", f"the break moves >= {shift:+g} octaves: fits B/N and B/B_crit"
            else:
                predictor, why = "none", f"the break moves {shift:+g} octaves: neither +2 (B/N) nor {c:+.2f} (B_crit)"
    verdict = {"B/N": Verdict.REPRODUCED, "B/B_crit": Verdict.PARTLY, "steps": Verdict.NOT_REPRODUCED,
               "none": Verdict.NOT_REPRODUCED, "undecided": Verdict.INCONCLUSIVE}[predictor]
    return PredictorTest("break", predictor, shift, low, high, c, c_low, c_high, sep, breaks, verdict, why,
                         extend and verdict != Verdict.NOT_TESTABLE)


# ----------------------------------------------------------------------------- Hoffer: the gap
def hoffer_gaps(rows: pd.DataFrame, sb: str = "sb", at_epochs: str = "lb_sqrt_gbn", at_steps: str = "lb_sqrt_gbn_ra",
                metric: str = "test_acc", variant: str = "variant", confidence: float = 0.95) -> pd.DataFrame:
    """Per N: the large batch minus the small batch (Welch, seeds that ended ok), at equal epochs (`at_epochs`)
    and at equal steps (`at_steps`): gap_epochs, gap_steps with their intervals, and per arm its seeds'
    count, variance and mean (for the contrast across N), diverged and unfinished runs."""
    n_col = _n_column(rows)
    out = []
    for n, g in rows.groupby(n_col, sort=True):
        ok = g[g["state"] == "ok"]
        ref = pd.to_numeric(ok[ok[variant] == sb][metric], errors="coerce").dropna()
        row: dict[str, object] = {"n": int(n), "sb_mean": float(ref.mean()) if len(ref) else math.nan,
                                  "sb_var": float(ref.var(ddof=1)) if len(ref) > 1 else math.nan, "sb_n": len(ref),
                                  "unfinished": int((~g["state"].isin(FINISHED)).sum())}
        for arm, name in (("epochs", at_epochs), ("steps", at_steps)):
            values = pd.to_numeric(ok[ok[variant] == name][metric], errors="coerce").dropna()
            d = welch_interval(values, ref, confidence)
            row.update({f"gap_{arm}": d.diff, f"gap_{arm}_low": d.low, f"gap_{arm}_high": d.high,
                        f"{arm}_n": len(values),
                        f"{arm}_var": float(values.var(ddof=1)) if len(values) > 1 else math.nan,
                        f"{arm}_diverged": int((g[g[variant] == name]["state"] == "diverged").sum())})
        out.append(row)
    return pd.DataFrame(out)


def _contrast(gaps: pd.DataFrame, arm: str, confidence: float = 0.95) -> tuple[float, float, float]:
    """T = gap(largest N) - gap(smallest N) for one arm: four independent groups of seeds, a Welch-Satterthwaite
    t interval on the contrast of their means."""
    table = gaps.sort_values("n")
    a, b = table.iloc[-1], table.iloc[0]
    t = float(a[f"gap_{arm}"] - b[f"gap_{arm}"])
    parts = [(a[f"{arm}_var"], a[f"{arm}_n"]), (a["sb_var"], a["sb_n"]), (b[f"{arm}_var"], b[f"{arm}_n"]),
             (b["sb_var"], b["sb_n"])]
    if any(not (n > 1 and math.isfinite(v)) for v, n in parts):
        return t, math.nan, math.nan
    terms = [v / n for v, n in parts]
    var = sum(terms)
    if var == 0:
        return t, t, t
    dof = var ** 2 / sum(x ** 2 / (n - 1) for x, (_, n) in zip(terms, parts))
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, dof)) * math.sqrt(var)
    return t, t - half, t + half


def gap_test(gaps: pd.DataFrame, ratio: CriticalBatchRatio, margin: float = MARGIN, *,
             bcrit_valid: bool) -> PredictorTest:
    """Hoffer's gap. steps: at equal steps the gap closes (lower end above -margin, no diverged seed) at every
    N, and at equal epochs a gap (upper end below -margin) exists at some N. Otherwise, T = gap_steps(N_large)
    - gap_steps(N_small): B/N when T's interval lies above 0 (the gap shrinks as B/N falls), B/B_crit when it
    lies within [-margin, +margin] (the gap stays while B/N falls 4x, B_crit fixed), undecided when it
    straddles (seeds are added once, then inconclusive), none when it lies below 0. Verdict (Hoffer's claim:
    the number of updates): steps reproduced; B/N partly if the gap closes at equal steps at the largest N,
    else not reproduced; B/B_crit and none not reproduced; undecided inconclusive. Without a valid B_crit at
    the smallest and largest N (`bcrit_valid`: valid_at_ends) B/B_crit is not testable: steps, B/N or undecided."""
    c, c_low, c_high = octaves(ratio)
    sep = bcrit_valid and separable(ratio)
    problems = [f"N = {r.n}: {r.unfinished} runs not finished" for r in gaps.itertuples() if r.unfinished]
    problems += [f"N = {r.n}: fewer than 2 seeds in a group" for r in gaps.itertuples()
                 if min(r.sb_n, r.epochs_n, r.steps_n) < 2]
    table = gaps.sort_values("n")
    if not problems and not (table["gap_epochs_high"] < -margin).any():
        problems.append("no gap at equal epochs at any N: nothing to explain")
    t = t_low = t_high = math.nan
    extend = False
    if problems:
        return PredictorTest("gap", "undecided", t, t_low, t_high, c, c_low, c_high, sep, gaps,
                             Verdict.NOT_TESTABLE, "; ".join(problems), extend, tuple(problems))
    closes = (table["gap_steps_low"] > -margin) & (table["steps_diverged"] == 0)
    extend = bool(((table["gap_steps_low"] <= -margin) & (table["gap_steps_high"] > -margin)).any())
    if closes.all():
        predictor, why = "steps", "at equal steps the gap closes at every N; at equal epochs there is one"
    else:
        t, t_low, t_high = _contrast(table, "steps")
        shown = f"T = {100 * t:+.2f} [{100 * t_low:+.2f}, {100 * t_high:+.2f}] points"
        if not bcrit_valid:
            predictor = "B/N" if t_low > 0 else "undecided"
            why = f"{shown}; B_crit is not valid at the smallest or largest N, so B/B_crit is not tested"
        elif not sep:
            predictor, why = "undecided", f"B_crit moves {c:+.2f} octaves: B/N and B/B_crit are not separable"
        elif t_low > 0:
            predictor = "B/N"
            why = f"at equal steps the gap shrinks as B/N falls 4x: {shown}"
        elif -margin <= t_low and t_high <= margin:
            predictor = "B/B_crit"
            why = f"at equal steps the gap stays as B/N falls 4x: {shown}"
        elif t_high < 0:
            predictor, why = "none", f"the gap grows as B/N falls: T = {100 * t:+.2f} points"
        else:
            predictor, why = "undecided", f"{shown} straddles"
            extend = True
    if predictor == "steps":
        verdict = Verdict.REPRODUCED
    elif predictor == "B/N":
        verdict = Verdict.PARTLY if bool(closes.iloc[-1]) else Verdict.NOT_REPRODUCED
    elif predictor == "undecided":
        verdict = Verdict.INCONCLUSIVE
    else:
        verdict = Verdict.NOT_REPRODUCED
    return PredictorTest("gap", predictor, t, t_low, t_high, c, c_low, c_high, sep, gaps, verdict, why, extend)



# ------------------------------------------------------------------------------ version 6: own-setting B_crit
TARGET_BATCH = 32          # the own-setting target: this batch size's mean accuracy at TARGET_EPOCHS, less MARGIN
TARGET_EPOCHS = 16.0
BCRIT_MIN_REACHED = 3      # a batch size enters the own-setting fit when this many seeds reached the target
BCRIT_MIN_BATCHES = 6      # the own-setting B_crit counts as measured with this many batch sizes in its fit


def own_setting_steps(runs: pd.DataFrame, metric: str = "test_acc", lr: str = "lr", rung: str = "budget_amount",
                      margin: float = MARGIN, target_batch: int = TARGET_BATCH,
                      target_epochs: float = TARGET_EPOCHS) -> pd.DataFrame:
    """bn_budget_bcrit_v6's steps to the designs' "holds", per (N, B, seed): target(N) = the mean `metric` of
    B = target_batch at target_epochs at its best lr (highest mean, a run not ok the worst) minus `margin`; at each
    rung (epochs budget) every seed is taken at the lr best on the other seeds; E* = the smallest rung whose run
    ended ok at or above the target; steps = E* x (N // B). Columns: n, batch_size, seed, epochs (NaN: never),
    steps, target, edge (the held-out lr at E* is the grid's smallest or largest there)."""
    n_col = _n_column(runs)
    out = []
    for n, g in runs.groupby(n_col, sort=True):
        score = pd.to_numeric(g[metric], errors="coerce").where(g["state"] == "ok")
        g = g.assign(_score=score, _lr=pd.to_numeric(g[lr], errors="coerce"))
        ref = g[(g["batch_size"] == target_batch) & np.isclose(g[rung].astype(float), target_epochs)]
        means = ref.groupby("_lr")["_score"].apply(lambda v: v.fillna(-math.inf).mean())
        target = float(ref[np.isclose(ref["_lr"], means.idxmax())]["_score"].mean()) - margin if len(means) \
            else math.nan
        for b, cell in g.groupby("batch_size", sort=True):
            for seed in sorted(cell["seed"].unique()):
                epochs, edge = math.nan, False
                for e in sorted(cell[rung].astype(float).unique()):
                    at = cell[np.isclose(cell[rung].astype(float), e)]
                    others = at[at["seed"] != seed].groupby("_lr")["_score"].apply(
                        lambda v: v.fillna(-math.inf).mean())
                    if others.empty:
                        continue
                    pick = float(others.idxmax())
                    mine = at[(at["seed"] == seed) & np.isclose(at["_lr"], pick)]["_score"]
                    if len(mine) and float(mine.iloc[0]) >= target:
                        lrs = sorted(at["_lr"].unique())
                        epochs, edge = e, len(lrs) >= 3 and pick in (lrs[0], lrs[-1])
                        break
                out.append({"n": int(n), "batch_size": int(b), "seed": seed, "epochs": epochs,
                            "steps": epochs * (int(n) // int(b)), "target": target, "edge": edge})
    return pd.DataFrame(out)


def in_fit(steps: pd.DataFrame, min_reached: int = BCRIT_MIN_REACHED) -> pd.Series:
    """Per row of own_setting_steps: whether its (N, B) enters the own-setting fit (at least `min_reached` seeds
    of that N and B reached the target) and the row itself reached it."""
    reached = steps["steps"].notna()
    counts = reached.groupby([steps["n"], steps["batch_size"]]).transform("sum")
    return reached & (counts >= min_reached)


def own_setting_bcrit(steps: pd.DataFrame, min_reached: int = BCRIT_MIN_REACHED,
                      min_batches: int = BCRIT_MIN_BATCHES,
                      resamples: int = 2000,
                      confidence: float = 0.95) -> tuple[pd.DataFrame, tuple[float, float, float]]:
    """Per N, McCandlish's B_crit fitted to every seed's steps at the batch sizes where >= min_reached seeds reached
    the target, with a percentile bootstrap over seeds (`resamples`, generator seed 0) and validity (>= min_batches
    batch sizes in the fit, no held-out lr on its grid's edge there); and c = log2 B_crit(largest N) / B_crit(smallest
    N) with the bootstrap interval of the same resamples (seeds drawn within each N). Zhang et al.'s definition
    (excess 20% over linear scaling from the smallest batch) beside it, secondary; s_min is the fit's S_min (the
    curve S_min (1 + B_crit / B) a figure draws)."""
    from ..measure.critical import critical_batch_size
    rng = np.random.default_rng(0)
    rows, boots = [], {}
    fitting = in_fit(steps, min_reached)
    for n, g in steps.groupby("n", sort=True):
        use = g[fitting.loc[g.index]]
        fitted = sorted(int(b) for b in use["batch_size"].unique())
        row: dict[str, object] = {"n": int(n), "n_batches": len(fitted), "edge": bool(use["edge"].any()),
                                  "b_crit": math.nan, "low": math.nan, "high": math.nan, "excess": math.nan,
                                  "valid": False, "s_min": math.nan}
        if len(fitted) >= 2:
            fit = critical_batch_size(use["batch_size"], use["steps"])
            excess = critical_batch_size(use["batch_size"], use["steps"], "excess")
            seeds = sorted(use["seed"].unique())
            values = []
            for _ in range(resamples):
                draw = rng.choice(seeds, size=len(seeds), replace=True)
                sample = pd.concat([use[use["seed"] == s] for s in draw])
                try:
                    values.append(critical_batch_size(sample["batch_size"], sample["steps"]).batch_size)
                except ConfigError:      # a resample with a single batch size cannot be fitted
                    values.append(math.nan)
            boots[int(n)] = np.array(values)
            tail = 100 * (1 - confidence) / 2
            row.update({"b_crit": fit.batch_size, "low": float(np.nanpercentile(values, tail)),
                        "high": float(np.nanpercentile(values, 100 - tail)), "excess": excess.batch_size,
                        "valid": len(fitted) >= min_batches and not bool(use["edge"].any()),
                        "s_min": fit.fit.s_min})
        rows.append(row)
    table = pd.DataFrame(rows)
    c = (math.nan, math.nan, math.nan)
    if valid_at_ends(table):
        small, large = int(table["n"].iloc[0]), int(table["n"].iloc[-1])
        shifts = np.log2(boots[large] / boots[small])
        tail = 100 * (1 - confidence) / 2
        c = (math.log2(float(table["b_crit"].iloc[-1]) / float(table["b_crit"].iloc[0])),
             float(np.nanpercentile(shifts, tail)), float(np.nanpercentile(shifts, 100 - tail)))
    return table, c


@dataclass(frozen=True)
class PredictorC:
    """The c that version 6's predictor tests use and what it was read from (predictor_c)."""
    c: tuple[float, float, float]  # B_crit's shift 10k -> 40k in octaves, with its interval
    source: str                    # where c comes from, in words (naming why the own-setting c is not used)
    table: pd.DataFrame            # own_setting_bcrit's fits (empty: the own-setting sweep not read)
    steps: pd.DataFrame            # own_setting_steps, per (N, B, seed), that the fits are made from (empty: idem)
    runs: pd.DataFrame             # the own-setting sweep's runs that were read (empty: idem)


def predictor_c(own: pd.DataFrame | None, fallback: tuple[float, float, float], own_name: str = "own setting",
                resamples: int = 2000) -> PredictorC:
    """c for version 6's predictor tests (docs/protocols.md#v6-predictors): B_crit's shift 10k -> 40k measured in
    the designs' own setting (`own`: the runs of bn_budget_bcrit_v6, through own_setting_steps and
    own_setting_bcrit) where it is measured (every run ended, valid at the smallest and largest N); otherwise
    `fallback`, version 5's plain-SGD c, as the protocol says. The own-setting tables are empty when `own` has no
    runs or some have not ended: a sweep still running is not read."""
    empty = pd.DataFrame()
    if own is None or own.empty:
        return PredictorC(fallback, f"plain-SGD c of version 5 ({own_name} has not run)", empty, empty, empty)
    open_runs = int((~own["state"].isin(FINISHED)).sum())
    if open_runs:
        return PredictorC(fallback, (f"plain-SGD c of version 5 ({own_name}: {open_runs} of {len(own)} runs have "
                                     f"not ended ok or diverged)"), empty, empty, empty)
    steps = own_setting_steps(own)
    table, c = own_setting_bcrit(steps, resamples=resamples)
    if all(math.isfinite(v) for v in c):
        return PredictorC(c, f"B_crit in the designs' own setting ({own_name})", table, steps, own)
    why = "; ".join(f"N = {r.n}: {r.n_batches} batch sizes in the fit" + (", a best lr on its grid's edge"
                                                                          if r.edge else "")
                    for r in table.itertuples() if not r.valid)
    return PredictorC(fallback, f"plain-SGD c of version 5 (the own-setting c is not measured: {why})", table,
                      steps, own)


def read_predictor_c(bcrit_sweep: str, runs_dir: str | Path, fallback_csv: str | Path) -> PredictorC:
    """predictor_c for an analysis notebook: the own-setting sweep's runs under `runs_dir` (None when it has not
    run) and version 5's c from its committed report's test.csv (`fallback_csv`, columns c, c_low, c_high)."""
    row = pd.read_csv(project_path(fallback_csv)).iloc[0]
    own = results.load(bcrit_sweep, runs_root=runs_dir) if results.sweeps_run(bcrit_sweep, runs_dir) else None
    return predictor_c(own, (float(row["c"]), float(row["c_low"]), float(row["c_high"])), bcrit_sweep)


# ----------------------------------------------------------------------------- version 6: Goyal's break, three arms
V6_ARMS = ("epochs", "steps", "examples")   # bn_budget_goyal_v6's variants e*, s*, x*


@dataclass(frozen=True)
class BreakPredictorTest(PreregisteredTest):
    """docs/protocols.md#v6-predictors, Goyal's break: A (the epochs arm breaks below the steps arm at every N:
    steps matter at fixed B/N and B/B_crit) and s_X (the examples arm's break shift 10k -> 40k, octaves: steps
    predict 0, B/N 2, B/B_crit c), the predictor they name and the verdict."""
    predictor: str               # steps | steps and B/N | B/N | B/B_crit | cannot be told apart
    steps_matter: bool           # A
    shift: float                 # s_X (its lower bound when the break at the largest N is beyond the grid)
    shift_censored: bool
    c: tuple[float, float, float]
    table: pd.DataFrame          # goyal_breaks over the three arms
    verdict: Verdict
    why: str
    extend_seeds: bool
    problems: tuple[str, ...] = ()


def predictor_break_test(breaks: pd.DataFrame, c: tuple[float, float, float] | None) -> BreakPredictorTest:
    """Version 6's test of Goyal's break on goyal_breaks of bn_budget_goyal_v6's runs (arm: epochs, steps,
    examples). Not testable: a row's problems (runs unfinished, a deciding best lr on the grid's edge), an arm
    missing, or the epochs arm breaking at no N. `c`: B_crit's shift 10k -> 40k (octaves, interval); None: B/B_crit
    cannot be named."""
    c = c if c is not None else (math.nan, math.nan, math.nan)
    problems = [f"N = {r.n} {r.arm}: {p}" for r in breaks.itertuples() for p in r.problems]
    if set(breaks["arm"]) != set(V6_ARMS):
        problems.append(f"arms {sorted(set(breaks['arm']))}, not {list(V6_ARMS)}")
    arm = {a: breaks[breaks["arm"] == a].set_index("n")["b_break"] for a in set(breaks["arm"])}
    epochs = arm.get("epochs", pd.Series(dtype=float))
    if not problems and not np.isfinite(epochs).any():
        problems.append("the epochs arm breaks at no N: no break to explain")
    extend = bool(breaks["extend_seeds"].any())
    if problems:
        return BreakPredictorTest("cannot be told apart", False, math.nan, False, c, breaks, Verdict.NOT_TESTABLE,
                                  "; ".join(problems), extend, tuple(problems))
    ns = sorted(breaks["n"].unique())
    steps_arm, examples = arm["steps"], arm["examples"]
    a_holds = all(epochs[n] < steps_arm[n] for n in ns)      # inf (no break) counts as the larger
    b_small, b_large = float(examples[ns[0]]), float(examples[ns[-1]])
    largest = float(breaks["largest"].max())
    censored = not math.isfinite(b_large)
    shift = math.log2((2 * largest if censored else b_large) / b_small) if math.isfinite(b_small) else math.nan
    c_inside = math.isfinite(c[1]) and -SEPARABLE < c[1] and c[2] < SEPARABLE
    at_least_one = math.isfinite(shift) and shift >= 1           # a censored shift is a lower bound
    below_one = math.isfinite(shift) and not censored and abs(shift) < 1
    if not math.isfinite(shift):
        predictor = "cannot be told apart"
        why = "the examples arm breaks at no batch size at the smallest N: its shift is undefined"
    elif a_holds and below_one:
        predictor, why = "steps", f"A holds; with the steps of each B fixed the break moves {shift:+g} octaves"
    elif a_holds and at_least_one:
        predictor, why = "steps and B/N", f"A holds; with the steps of each B fixed the break moves {shift:+g} octaves"
    elif not a_holds and at_least_one and math.isfinite(c[2]) and c[2] < 1:
        predictor, why = "B/N", f"A fails; the break moves {shift:+g} octaves, B_crit {c[0]:+.2f}"
    elif not a_holds and not censored and abs(shift - c[0]) < 1 and math.isfinite(c[1]) and not c_inside \
            and c[2] < 1:
        predictor, why = "B/B_crit", f"A fails; the break moves {shift:+g} octaves, as B_crit ({c[0]:+.2f})"
    else:
        predictor = "cannot be told apart"
        why = f"A {'holds' if a_holds else 'fails'}; the break moves {'>= ' if censored else ''}{shift:+g} octaves; " \
              f"c {c[0]:+.2f} [{c[1]:+.2f}, {c[2]:+.2f}]"
    verdict = {"B/N": Verdict.REPRODUCED, "steps and B/N": Verdict.PARTLY, "B/B_crit": Verdict.PARTLY,
               "steps": Verdict.NOT_REPRODUCED, "cannot be told apart": Verdict.INCONCLUSIVE}[predictor]
    return BreakPredictorTest(predictor, a_holds, shift, censored, c, breaks, verdict, why, extend)


# ----------------------------------------------------------------------------- version 6: Hoffer's gap, two contrasts
N_NAMES = {10000: "n10k", 20000: "n20k", 40000: "n40k"}
V6_CELLS: dict[str, dict[int, str]] = {   # experiments/bn_budget_hoffer_v6.yaml's variants, per N
    "lb_epochs": {n: f"lbe_{k}" for n, k in N_NAMES.items()},
    "lb_steps": {n: f"lbs_{k}" for n, k in N_NAMES.items()},
    "lb_examples": {10000: "lbx_n10k", 20000: "lbx_n20k", 40000: "lbe_n40k"},   # 400 000 examples: 400 steps
    "sb": {n: f"sb_{k}" for n, k in N_NAMES.items()},
    "sb_examples": {10000: "sb4_n10k", 20000: "sb2_n20k", 40000: "sb_n40k"},    # 400 000 examples: 12 500 steps
}
LADDER = ((10000, 2, "sb2_n10k"), (10000, 4, "sb4_n10k"), (20000, 2, "sb2_n20k"))


def welch_contrast(groups: list[tuple[pd.Series, float]], confidence: float = 0.95) -> tuple[float, float, float]:
    """(sum_g w_g mean_g, low, high): independent groups of seeds, a Welch-Satterthwaite t interval; NaN bounds
    when a group has fewer than 2 values."""
    values = [(pd.to_numeric(v, errors="coerce").dropna(), w) for v, w in groups]
    estimate = float(sum(w * v.mean() for v, w in values))
    if any(len(v) < 2 for v, _ in values):
        return estimate, math.nan, math.nan
    terms = [w ** 2 * float(v.var(ddof=1)) / len(v) for v, w in values]
    var = sum(terms)
    if var == 0:
        return estimate, estimate, estimate
    dof = var ** 2 / sum(x ** 2 / (len(v) - 1) for x, (v, _) in zip(terms, values))
    half = float(scipy_stats.t.ppf((1 + confidence) / 2, dof)) * math.sqrt(var)
    return estimate, estimate - half, estimate + half


@dataclass(frozen=True)
class GapPredictorTest(PreregisteredTest):
    """docs/protocols.md#v6-predictors, Hoffer's gap: Delta_S per N (steps at one N) and Delta_N (B/N at fixed
    steps and examples), the predictor they name and the verdict; the ladder beside it."""
    predictor: str               # steps | steps and B/N | B/N | B/B_crit | none | cannot be told apart
    table: pd.DataFrame          # per N: gap_epochs, delta_s, gap_examples (each with low, high)
    delta_n: tuple[float, float, float]
    c: tuple[float, float, float]
    ladder: pd.DataFrame         # n, k, u (sb at k x 10 epochs - sb at 10), low, high, under_trained, and
    #                              gap_steps_longest (lb_steps - the longest sb) with its interval
    verdict: Verdict
    why: str
    extend_seeds: bool
    problems: tuple[str, ...] = ()


def _inside(low: float, high: float, margin: float) -> bool:
    return -margin <= low and high <= margin


def predictor_gap_test(rows: pd.DataFrame, c: tuple[float, float, float] | None, margin: float = MARGIN,
                       metric: str = "test_acc", variant: str = "variant",
                       confidence: float = 0.95) -> GapPredictorTest:
    """Version 6's test of Hoffer's gap on bn_budget_hoffer_v6's runs (module docstring; the rules are the
    protocol's, word for word in the spec's header). `c`: B_crit's shift 10k -> 40k in octaves with its interval
    (the designs' own setting when measured, else version 5's, which the report labels: `octaves(bcrit_shift(...))`
    or the committed reports/bn_budget_goyal/test.csv's c, c_low, c_high); None: B/B_crit cannot be named."""
    def group(name: str, ok_only: bool = True) -> pd.Series:
        g = rows[rows[variant] == name]
        return pd.to_numeric((g[g["state"] == "ok"] if ok_only else g)[metric], errors="coerce").dropna()

    problems = []
    names = sorted({name for cells in V6_CELLS.values() for name in cells.values()} | {n for *_, n in LADDER})
    for name in names:
        mine = rows[rows[variant] == name]
        unfinished = int((~mine["state"].isin(FINISHED)).sum())
        if unfinished:
            problems.append(f"{name}: {unfinished} runs not finished")
        if len(group(name)) < 2:
            problems.append(f"{name}: fewer than 2 finished seeds")
    table_rows = []
    for n in sorted(N_NAMES):
        cell = {arm: V6_CELLS[arm][n] for arm in V6_CELLS}
        gap_e = welch_interval(group(cell["lb_epochs"]), group(cell["sb"]), confidence)
        d_s = welch_interval(group(cell["lb_steps"]), group(cell["lb_epochs"]), confidence)
        gap_x = welch_interval(group(cell["lb_examples"]), group(cell["sb_examples"]), confidence)
        table_rows.append({"n": n, "gap_epochs": gap_e.diff, "gap_epochs_low": gap_e.low,
                           "gap_epochs_high": gap_e.high, "delta_s": d_s.diff, "delta_s_low": d_s.low,
                           "delta_s_high": d_s.high, "gap_examples": gap_x.diff, "gap_examples_low": gap_x.low,
                           "gap_examples_high": gap_x.high})
    table = pd.DataFrame(table_rows)
    ladder = []
    for n, k, name in LADDER:
        u = welch_interval(group(name), group(V6_CELLS["sb"][n]), confidence)
        longest = max((kk for nn, kk, _ in LADDER if nn == n))
        long_name = next(nm for nn, kk, nm in LADDER if nn == n and kk == longest)
        g = welch_interval(group(V6_CELLS["lb_steps"][n]), group(long_name), confidence)
        ladder.append({"n": n, "k": k, "u": u.diff, "low": u.low, "high": u.high, "under_trained": bool(u.low > 0),
                       "longest_sb": long_name, "gap_steps_longest": g.diff, "gap_steps_longest_low": g.low,
                       "gap_steps_longest_high": g.high})
    nan3 = (math.nan, math.nan, math.nan)
    c = c if c is not None else nan3
    if not problems and not (table["gap_epochs_high"] < -margin).any():
        problems.append("no gap at equal epochs at any N: nothing to explain")
    if problems:
        return GapPredictorTest("cannot be told apart", table, nan3, c, pd.DataFrame(ladder), Verdict.NOT_TESTABLE,
                                "; ".join(problems), False, tuple(problems))
    x10, x40 = V6_CELLS["lb_examples"], V6_CELLS["sb_examples"]
    delta_n = welch_contrast([(group(x10[40000]), 1.0), (group(x40[40000]), -1.0), (group(x10[10000]), -1.0),
                              (group(x40[10000]), 1.0)], confidence)
    s_above = bool((table["delta_s_low"] > margin).all())
    s_inside = all(_inside(r.delta_s_low, r.delta_s_high, margin) for r in table.itertuples())
    s_below = bool((table["delta_s_high"] < -margin).any())
    n_above, n_below = delta_n[1] > margin, delta_n[2] < -margin
    n_inside = _inside(delta_n[1], delta_n[2], margin)
    c_inside = math.isfinite(c[1]) and -SEPARABLE < c[1] and c[2] < SEPARABLE
    if n_below or s_below:
        predictor = "none"
    elif s_above and n_inside:
        predictor = "steps"
    elif s_above and n_above:
        predictor = "steps and B/N"
    elif s_inside and n_above:
        predictor = "B/N"
    elif s_inside and n_inside and c_inside:
        predictor = "B/B_crit"
    else:
        predictor = "cannot be told apart"
    shown = ", ".join(f"Delta_S({r.n // 1000}k) {100 * r.delta_s:+.2f} [{100 * r.delta_s_low:+.2f}, "
                      f"{100 * r.delta_s_high:+.2f}]" for r in table.itertuples())
    why = f"{shown}; Delta_N {100 * delta_n[0]:+.2f} [{100 * delta_n[1]:+.2f}, {100 * delta_n[2]:+.2f}] points"
    verdict = {"steps": Verdict.REPRODUCED, "steps and B/N": Verdict.PARTLY,
               "cannot be told apart": Verdict.INCONCLUSIVE}.get(predictor, Verdict.NOT_REPRODUCED)
    return GapPredictorTest(predictor, table, delta_n, c, pd.DataFrame(ladder), verdict, f"{predictor}: {why}", False)
