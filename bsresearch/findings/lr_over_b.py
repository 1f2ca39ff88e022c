"""lr/B at a common train loss (Smith & Le 2018; Jastrzebski et al. 2017): is the test accuracy of runs trained
to the same train loss a function of lr/B alone, and where does it stop being one? Protocol version 5
(docs/protocols.md#lr-over-b). No torch import.

    runs = runs.assign(reached=...)            # a run reached the common train loss (budget target, ended ok there)
    table = diagonal_table(runs)               # per (lr/B, lr): seeds, seeds at the target, test accuracy
    test = equivalence_test(runs)              # along each lr/B diagonal: how far in lr it stays a function of lr/B
    steps_table(runs), margin_table(runs)      # secondary: steps to the target per cell; the test at other margins
    ratio = ratio_test(runs)                   # version 6: lr's effect at fixed lr/B over lr/B's, Fieller interval

A diagonal is a set of cells with one value of lr/B and lr (hence B) growing by factors of 2. Along it, each
lr is compared with the diagonal's smallest lr (the reference) by Welch's interval on the test accuracy of the
runs that reached the target: "same" when the interval lies inside [-margin, +margin], "differs" when it lies
wholly outside, "undecided" otherwise; a cell where fewer than 3 seeds reached the target "stops" (training
breaks there). The span of a diagonal is (the largest lr up to which every lr is "same") / (the reference lr).

Version 6 (docs/protocols.md#v6-lr-over-b) asks instead how large lr's effect is next to lr/B's: per seed, least
squares of the accuracy on (1, log2 lr, log2 lr/B) over the cells that count gives b_lr and b_r (per doubling);
rho = mean b_lr / mean b_r with its Fieller interval, judged against +-1/4 once lr/B is shown to move the accuracy.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.lr_over_b.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config import ConfigError
from ..rundir import FINISHED_STATES as FINISHED  # the end states of a run that count (others are rerun)
from ..stats import t_interval, welch_interval
from .verdict import PreregisteredTest, Verdict

MARGIN = 0.01          # 1 point: "the same accuracy"
MIN_REACHED = 3        # seeds of 5 that must reach the target for a cell to count
MIN_SPAN = 4.0         # lr/B alone must predict the accuracy over at least a factor 4 of lr (and of B)
MIN_LRS = 3            # a diagonal needs this many cells that reach the target to be judged


def _with_ratio(runs: pd.DataFrame, lr: str, batch: str) -> pd.DataFrame:
    for column in (lr, batch, "seed", "state", "reached"):
        if column not in runs:
            raise ConfigError(f"lr/B analysis: the runs table has no column {column!r}")
    ratio = pd.to_numeric(runs[lr], errors="coerce") / pd.to_numeric(runs[batch], errors="coerce")
    # lr/B rounded to 6 significant digits: cells of one diagonal share it exactly in the specs
    return runs.assign(lr_over_b=[float(f"{r:.6g}") for r in ratio], _lr=pd.to_numeric(runs[lr], errors="coerce"))


def diagonal_table(runs: pd.DataFrame, metric: str = "test_acc", lr: str = "lr", batch: str = "batch_size",
                   min_reached: int = MIN_REACHED) -> pd.DataFrame:
    """Per (lr_over_b, lr): batch size, seeds, seeds that reached the target, mean and std of `metric` over
    those, and `included` (at least min_reached reached)."""
    data = _with_ratio(runs, lr, batch)
    out = []
    for (ratio, lr_value), g in data.groupby(["lr_over_b", "_lr"], sort=True):
        reached = g[g["reached"].astype(bool)]
        values = pd.to_numeric(reached[metric], errors="coerce").dropna()
        out.append({"lr_over_b": ratio, "lr": lr_value, "batch_size": int(g[batch].iloc[0]), "n": len(g),
                    "n_reached": len(reached), "mean": float(values.mean()) if len(values) else math.nan,
                    "std": float(values.std(ddof=1)) if len(values) > 1 else math.nan,
                    "included": len(reached) >= min_reached,
                    "unfinished": int((~g["state"].isin(FINISHED)).sum())})
    return pd.DataFrame(out)


def along_diagonals(runs: pd.DataFrame, metric: str = "test_acc", lr: str = "lr", batch: str = "batch_size",
                    margin: float = MARGIN, min_reached: int = MIN_REACHED, confidence: float = 0.95) -> pd.DataFrame:
    """One row per cell: its diagonal's reference lr, the Welch difference from the reference (fraction), and
    the status: reference | same | differs | undecided | stops (fewer than min_reached seeds at the target)."""
    data = _with_ratio(runs, lr, batch)
    table = diagonal_table(runs, metric, lr, batch, min_reached)
    out = []
    for ratio, cells in table.groupby("lr_over_b", sort=True):
        included = cells[cells["included"]]
        if included.empty:
            continue
        ref_lr = float(included["lr"].min())
        on = data[(data["lr_over_b"] == ratio) & data["reached"].astype(bool)]
        ref = pd.to_numeric(on[np.isclose(on["_lr"], ref_lr)][metric], errors="coerce")
        for cell in cells.sort_values("lr").itertuples():
            if cell.lr < ref_lr:
                status, d = "stops", None
            elif np.isclose(cell.lr, ref_lr):
                status, d = "reference", None
            elif not cell.included:
                status, d = "stops", None
            else:
                values = pd.to_numeric(on[np.isclose(on["_lr"], cell.lr)][metric], errors="coerce")
                d = welch_interval(values, ref, confidence)
                if not math.isfinite(d.low):
                    status = "undecided"
                elif -margin <= d.low and d.high <= margin:
                    status = "same"
                elif d.low > margin or d.high < -margin:
                    status = "differs"
                else:
                    status = "undecided"
            out.append({"lr_over_b": ratio, "lr": cell.lr, "batch_size": cell.batch_size, "reference_lr": ref_lr,
                        "n_reached": cell.n_reached, "mean": cell.mean,
                        "diff": d.diff if d else (0.0 if status == "reference" else math.nan),
                        "low": d.low if d else math.nan, "high": d.high if d else math.nan, "status": status})
    return pd.DataFrame(out)


@dataclass(frozen=True)
class EquivalenceTest(PreregisteredTest):
    """docs/protocols.md#lr-over-b: per diagonal, the span in lr over which lr/B alone predicts the accuracy."""
    per_diagonal: pd.DataFrame   # lr_over_b, reference_lr, span, stops_at (lr of the first cell that is not
    #                              "same": NaN if none), stops_why (differs / stops / undecided / grid end),
    #                              n_included, undecided_before_span
    cells: pd.DataFrame          # along_diagonals
    n_holding: int               # diagonals whose span is at least min_span
    n_diagonals: int
    min_span: float
    verdict: Verdict
    why: str
    extend_seeds: bool
    problems: tuple[str, ...] = ()


def equivalence_test(runs: pd.DataFrame, metric: str = "test_acc", lr: str = "lr", batch: str = "batch_size",
                     margin: float = MARGIN, min_span: float = MIN_SPAN, min_reached: int = MIN_REACHED,
                     min_lrs: int = MIN_LRS, max_seeds: int = 8, confidence: float = 0.95) -> EquivalenceTest:
    """Reproduced when every diagonal's span is at least min_span (lr/B alone predicts the accuracy over a
    factor min_span of lr and of B at every lr/B tried); partly when some but not all are; not reproduced when
    none is. Not testable: unfinished runs, fewer than 2 diagonals, or a diagonal with fewer than min_lrs
    cells that reach the target. extend_seeds: an "undecided" cell comes before its diagonal's span reaches
    min_span, with fewer than max_seeds seeds (statistics item 3: once, to 8)."""
    table = diagonal_table(runs, metric, lr, batch, min_reached)
    cells = along_diagonals(runs, metric, lr, batch, margin, min_reached, confidence)
    problems = []
    if int(table["unfinished"].sum()):
        problems.append(f"{int(table['unfinished'].sum())} runs not finished")
    rows, extend = [], False
    n_seeds = int(runs["seed"].nunique())
    for ratio, g in table.groupby("lr_over_b", sort=True):
        mine = cells[cells["lr_over_b"] == ratio].sort_values("lr") if len(cells) else cells
        n_included = int(g["included"].sum())
        if n_included < min_lrs:
            problems.append(f"lr/B = {ratio:.3g}: {n_included} cells reach the target (needs {min_lrs})")
        span, stops_at, why, undecided = 1.0, math.nan, "grid end", False
        started = False
        for c in mine.itertuples():
            if c.status == "reference":
                started, span = True, 1.0
                continue
            if not started:
                continue
            if c.status == "same":
                span = c.lr / c.reference_lr
                continue
            stops_at, why = c.lr, c.status
            undecided = c.status == "undecided" and span < min_span
            break
        extend = extend or (undecided and n_seeds < max_seeds)
        rows.append({"lr_over_b": ratio, "reference_lr": float(mine["reference_lr"].iloc[0]) if len(mine) else math.nan,
                     "span": span, "stops_at": stops_at, "stops_why": why, "n_included": n_included,
                     "undecided_before_span": undecided})
    per = pd.DataFrame(rows)
    verdict, why_all, holding = span_verdict(per, problems, min_span)
    return EquivalenceTest(per, cells, holding, len(per), min_span, verdict, why_all,
                           extend and verdict != Verdict.NOT_TESTABLE, tuple(problems))


def span_verdict(per_diagonal: pd.DataFrame, problems: list[str],
                 min_span: float = MIN_SPAN) -> tuple[Verdict, str, int]:
    """(verdict, why, diagonals holding) from the per-diagonal spans (EquivalenceTest.per_diagonal, or a report's
    committed test.csv) and the validity problems found so far (fewer than 2 diagonals is added here)."""
    problems = list(problems) + ([f"{len(per_diagonal)} diagonal(s): needs 2"] if len(per_diagonal) < 2 else [])
    holding = int((per_diagonal["span"] >= min_span).sum()) if len(per_diagonal) else 0
    if problems:
        return Verdict.NOT_TESTABLE, "; ".join(problems), holding
    if holding == len(per_diagonal):
        return Verdict.REPRODUCED, f"every diagonal ({holding}) is a function of lr/B over >= {min_span:g}x in lr", \
            holding
    if holding:
        return Verdict.PARTLY, f"{holding} of {len(per_diagonal)} diagonals hold over >= {min_span:g}x in lr", holding
    return Verdict.NOT_REPRODUCED, f"no diagonal holds over {min_span:g}x in lr", holding


def test_table(test: EquivalenceTest) -> pd.DataFrame:
    """test.csv: the per-diagonal spans with the test's verdict and why on every row (the gallery reads the
    verdict column)."""
    return test.per_diagonal.assign(verdict=str(test.verdict), why=test.why)


def accuracy_table(runs: pd.DataFrame, metric: str = "test_acc", lr: str = "lr",
                   batch: str = "batch_size") -> pd.DataFrame:
    """Secondary: per (lr/B, lr), the mean test accuracy of the seeds that reached the target and its 95% t
    interval over them (stats.t_interval); cells no seed reached are left out."""
    reached = _with_ratio(runs[runs["reached"]], lr, batch)
    rows = []
    for (ratio, rate), g in reached.groupby(["lr_over_b", "_lr"], sort=True):
        mean, std, low, high = t_interval(g[metric])
        rows.append({"lr_over_b": ratio, "lr": rate, "n_reached": len(g), "mean": mean, "std": std, "low": low,
                     "high": high})
    return pd.DataFrame(rows)


def steps_table(runs: pd.DataFrame, lr: str = "lr", batch: str = "batch_size") -> pd.DataFrame:
    """Secondary: per (lr/B, lr, B), the seeds that reached the target and their steps to it (mean, min, max)."""
    reached = _with_ratio(runs[runs["reached"]], lr, batch)
    return (reached.groupby(["lr_over_b", lr, batch], as_index=False)
            .agg(n_reached=("steps_to_target", "size"), mean_steps=("steps_to_target", "mean"),
                 min_steps=("steps_to_target", "min"), max_steps=("steps_to_target", "max")))


def margin_table(runs: pd.DataFrame, margins: tuple[float, ...] = (0.005, 0.01, 0.02)) -> pd.DataFrame:
    """Secondary: the equivalence test's per-diagonal span at each margin (0.01 is the pre-registered one)."""
    rows = []
    for margin in margins:
        test = equivalence_test(runs, margin=margin)
        rows += [{"margin": margin, **row, "verdict": str(test.verdict)}
                 for row in test.per_diagonal.to_dict("records")]
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- version 6: the ratio of the effects
RHO_MARGIN = 0.25      # version 6: lr's effect at fixed lr/B at most a quarter of lr/B's


def per_seed_slopes(runs: pd.DataFrame, metric: str = "test_acc", lr: str = "lr", batch: str = "batch_size",
                    min_reached: int = MIN_REACHED) -> pd.DataFrame:
    """Per seed: b_lr and b_r, the least-squares slopes of `metric` on log2 lr and log2 (lr/B) (with an intercept)
    over that seed's runs that reached the target in the cells that count (diagonal_table's `included`), and
    n_cells; a seed with fewer than 3 such cells, or whose cells do not vary both lr and lr/B, gets NaN slopes."""
    data = _with_ratio(runs, lr, batch)
    table = diagonal_table(runs, metric, lr, batch, min_reached)
    counted = {(float(r.lr_over_b), float(r.lr)) for r in table.itertuples() if r.included}
    rows = []
    for seed, g in data.groupby("seed", sort=True):
        in_counted = np.array([(float(r), float(x)) in counted for r, x in zip(g["lr_over_b"], g["_lr"])], dtype=bool)
        use = g[g["reached"].astype(bool).to_numpy() & in_counted]
        y = pd.to_numeric(use[metric], errors="coerce").to_numpy(float)
        x = np.column_stack([np.ones(len(use)), np.log2(use["_lr"].to_numpy(float)),
                             np.log2(use["lr_over_b"].to_numpy(float))])
        slopes = (math.nan, math.nan)
        if len(use) >= 3 and np.all(np.isfinite(y)) and np.linalg.matrix_rank(x) == 3:
            coef = np.linalg.lstsq(x, y, rcond=None)[0]
            slopes = (float(coef[1]), float(coef[2]))
        rows.append({"seed": seed, "b_lr": slopes[0], "b_r": slopes[1], "n_cells": len(use)})
    return pd.DataFrame(rows)


def fieller_interval(a: np.ndarray, b: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean a / mean b, low, high) for paired per-seed values: the set of rho for which the t interval of the
    per-seed a - rho b contains 0 (Fieller). Bounded only when mean b is itself shown to differ from 0; otherwise
    (-inf, inf) (the set is then unbounded). Requires two or more seeds."""
    from scipy import stats
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n = len(a)
    if n != len(b) or n < 2:
        raise ConfigError(f"Fieller interval: needs two paired lists of >= 2 values; got {len(a)} and {len(b)}")
    ma, mb = float(a.mean()), float(b.mean())
    cov = np.cov(np.stack([a, b]), ddof=1)
    q = float(stats.t.ppf((1 + confidence) / 2, n - 1)) ** 2 / n
    qa, qb, qc = mb ** 2 - q * cov[1, 1], -2 * (ma * mb - q * cov[0, 1]), ma ** 2 - q * cov[0, 0]
    ratio = ma / mb if mb else math.nan
    disc = qb ** 2 - 4 * qa * qc
    if qa <= 0 or disc < 0:
        return ratio, -math.inf, math.inf
    root = math.sqrt(disc)
    return ratio, (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)


@dataclass(frozen=True)
class RatioTest(PreregisteredTest):
    """docs/protocols.md#v6-lr-over-b: rho = (lr's effect at fixed lr/B) / (lr/B's effect), per doubling."""
    per_seed: pd.DataFrame       # per_seed_slopes
    b_r: tuple[float, float, float]      # mean lr/B slope (fraction per doubling), its t interval
    b_lr: tuple[float, float, float]     # mean lr slope at fixed lr/B, its t interval
    rho: float
    rho_low: float               # Fieller interval (+-inf when unbounded)
    rho_high: float
    precondition: bool           # b_r's interval lies above 0: accuracy moves with lr/B
    margin: float
    n_seeds: int
    verdict: Verdict
    why: str
    extend_seeds: bool
    problems: tuple[str, ...] = ()


def ratio_test(runs: pd.DataFrame, metric: str = "test_acc", lr: str = "lr", batch: str = "batch_size",
               margin: float = RHO_MARGIN, min_reached: int = MIN_REACHED, min_lrs: int = MIN_LRS,
               max_seeds: int = 8, confidence: float = 0.95) -> RatioTest:
    """Version 6's lr/B test. Not testable: runs unfinished, fewer than 2 diagonals or `min_lrs` lrs that count,
    fewer than 2 seeds with slopes, or the precondition failing (the lr/B slope's interval not above 0: no effect
    to compare against, which the verdict says). Reproduced: rho's Fieller interval inside [-margin, +margin];
    not reproduced: wholly outside; partly: straddling (extend_seeds with fewer than max_seeds seeds)."""
    table = diagonal_table(runs, metric, lr, batch, min_reached)
    slopes = per_seed_slopes(runs, metric, lr, batch, min_reached)
    fitted = slopes.dropna(subset=["b_lr", "b_r"])
    problems = []
    if int(table["unfinished"].sum()):
        problems.append(f"{int(table['unfinished'].sum())} runs not finished")
    counted = table[table["included"]]
    if counted["lr_over_b"].nunique() < 2 or counted["lr"].nunique() < min_lrs:
        problems.append(f"{counted['lr_over_b'].nunique()} diagonals and {counted['lr'].nunique()} lrs count "
                        f"(needs 2 and {min_lrs})")
    if len(fitted) < 2:
        problems.append(f"{len(fitted)} seeds with slopes (needs 2)")
    nan3 = (math.nan, math.nan, math.nan)
    if problems:
        return RatioTest(slopes, nan3, nan3, math.nan, math.nan, math.nan, False, margin, len(fitted),
                         Verdict.NOT_TESTABLE, "; ".join(problems), False, tuple(problems))
    b_r = t_interval(fitted["b_r"], confidence)
    b_lr = t_interval(fitted["b_lr"], confidence)
    b_r3, b_lr3 = (b_r[0], b_r[2], b_r[3]), (b_lr[0], b_lr[2], b_lr[3])
    rho, low, high = fieller_interval(fitted["b_lr"].to_numpy(), fitted["b_r"].to_numpy(), confidence)
    slope = f"lr/B slope {100 * b_r[0]:+.2f} [{100 * b_r[2]:+.2f}, {100 * b_r[3]:+.2f}] points per doubling"
    if not b_r[2] > 0:
        why = f"precondition fails: {slope}; accuracy is not shown to move with lr/B, so lr's effect has nothing " \
              f"to be compared with"
        return RatioTest(fitted, b_r3, b_lr3, rho, low, high, False, margin, len(fitted), Verdict.NOT_TESTABLE, why,
                         False, ("precondition: the lr/B slope's interval is not above 0",))
    shown = f"rho = {rho:+.3f} [{low:+.3f}, {high:+.3f}] ({slope})"
    extend = False
    if -margin <= low and high <= margin:
        verdict, why = Verdict.REPRODUCED, f"{shown}: inside +-{margin:g}"
    elif low > margin or high < -margin:
        verdict, why = Verdict.NOT_REPRODUCED, f"{shown}: wholly outside +-{margin:g}"
    else:
        verdict, why = Verdict.PARTLY, f"{shown}: straddles +-{margin:g}"
        extend = len(fitted) < max_seeds
    return RatioTest(fitted, b_r3, b_lr3, rho, low, high, True, margin, len(fitted), verdict, why, extend)


def ratio_table(test: RatioTest) -> pd.DataFrame:
    """The version-6 test as one row (test.csv's form: the gallery reads its `verdict` column)."""
    return pd.DataFrame([{"statistic": "rho = b_lr / b_r", "estimate": test.rho, "low": test.rho_low,
                          "high": test.rho_high, "b_r": test.b_r[0], "b_r_low": test.b_r[1], "b_r_high": test.b_r[2],
                          "b_lr": test.b_lr[0], "b_lr_low": test.b_lr[1], "b_lr_high": test.b_lr[2],
                          "precondition": test.precondition, "margin": test.margin, "seeds": test.n_seeds,
                          "verdict": str(test.verdict), "why": test.why}])
