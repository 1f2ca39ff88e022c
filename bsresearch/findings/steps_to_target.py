"""Steps to a target against batch size (Shallue et al. 2019; McCandlish et al. 2018), from sweep tables.

    best = tuned_table(runs)                      # per batch size: best lr, interior?, steps/examples at it
    per_seed = at_best_lr(runs, best)             # every seed's run at its batch size's best lr
    fits = critical_batch_fits(per_seed)          # S = S_min (1 + B_crit/B): all seeds, seed means, each seed
    regime_boundaries(b_crit)                     # where the fitted curve's scaling exponent is 0.8 and 0.2
    local_exponents(best)                         # the measured exponent between neighbouring batch sizes
    noise = noise_checkpoints(noise_runs)         # B_simple / B_noise measured at checkpoints of one run
    value_at_loss(noise, 0.3, "b_simple")         # B_simple where the run crossed the target loss
    noise_summary_test(noise_ratio_summaries(at_weights, points))   # v4: r under every summary, seed bootstrap
    two_batch_agreement(table)                    # v4: the two-batch B_simple against the exact one

S is in optimizer steps, E = S x B in examples, B in examples per update; the target is a full-train
loss (mean cross-entropy), read at the evaluation steps, so S has that schedule's resolution.
No torch import: this runs wherever the run directories can be read.
Setting and pre-registered test: docs/protocols.md#steps-to-target.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.steps_to_target.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import results, stats
from ..config import ConfigError
from ..measure.critical import CriticalBatchFit, fit_critical_batch
from .verdict import PreregisteredTest, Verdict

REGIMES = ("perfect scaling", "diminishing returns", "maximal data parallelism")
# The fitted S = S_min (1 + B_crit/B) has local scaling exponent -dlog S/dlog B = B_crit/(B + B_crit):
# 1 at small B (doubling B halves S), 0 at large B. The regimes are split where it is 0.8 and 0.2, i.e.
# at B_crit/4 and 4 B_crit, symmetric about B_crit on a log axis.
PERFECT_EXPONENT = 0.8
MAXIMAL_EXPONENT = 0.2


# ----------------------------------------------------------------------------- the tuned lr
def tuned_table(runs: pd.DataFrame, steps: str = "steps_to_target", examples: str = "examples_to_target",
                by: str = "batch_size", lr: str = "lr", confidence: float = 0.95) -> pd.DataFrame:
    """Per batch size: the lr with the fewest mean steps over seeds and what was measured at it.

    `runs` is a results.load table of target-budget runs (all states: a run that diverged or hit its
    cap has no steps and counts as the worst, as in stats.best_lr). Columns: `by`, lr, interior (the
    best lr lies strictly inside the lrs tried), lr_min, lr_max, n_lrs, n_seeds, n_reached (seeds that
    reached the target at the best lr), then for `steps` and `examples` the mean, std and Student-t
    interval over those seeds (`steps_mean`, `steps_std`, `steps_low`, `steps_high`, ...).
    """
    best = stats.best_lr(runs, steps, by=by, lr=lr, minimize=True)
    chosen = at_best_lr(runs, best, by=by, lr=lr)
    summary = stats.summarize(chosen, by, [steps, examples], confidence)
    summary = summary.rename(columns=lambda c: c.replace(steps, "steps").replace(examples, "examples"))
    reached = chosen.groupby(by)[steps].apply(lambda s: int(pd.to_numeric(s, errors="coerce").notna().sum()))
    spans = runs.groupby(by)[lr].agg(lr_min="min", lr_max="max")
    table = best.drop(columns=[steps]).merge(spans, on=by).merge(summary.drop(columns=["n"]), on=by)
    table.insert(table.columns.get_loc("n_seeds") + 1, "n_reached", table[by].map(reached).astype(int))
    return table


def at_best_lr(runs: pd.DataFrame, best: pd.DataFrame, by: str = "batch_size", lr: str = "lr") -> pd.DataFrame:
    """The rows of `runs` at their batch size's best lr (one per seed), in batch-size order."""
    keys = best[[by, lr]]
    return runs.merge(keys, on=[by, lr], how="inner").sort_values([by, "seed"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- the critical batch size
def critical_batch_fits(per_seed: pd.DataFrame, steps: str = "steps_to_target", by: str = "batch_size",
                        confidence: float = 0.95) -> pd.DataFrame:
    """S = S_min (1 + B_crit/B) fitted three ways to the runs at the best lr (from at_best_lr):

    - "all seeds": every seed's point (its interval reflects the seed-to-seed scatter and lack of fit);
    - "seed mean": the mean over seeds per batch size;
    - "seed N": each seed alone (their spread is a second, model-free look at the uncertainty).
    One row per fit: fit, n_points, b_crit with its `confidence` interval and standard error, s_min with
    its interval, e_min = S_min B_crit with its standard error, rms_log_residual. Runs that did not reach
    the target are left out (the fit needs finite steps).
    """
    data = per_seed[[by, "seed", steps]].apply(pd.to_numeric, errors="coerce").dropna()
    if data[by].nunique() < 2:
        raise ConfigError(f"a critical batch fit needs steps at 2 or more batch sizes; got {sorted(data[by].unique())}")
    groups = [("all seeds", data), ("seed mean", data.groupby(by, as_index=False)[steps].mean())]
    groups += [(f"seed {int(s)}", g) for s, g in data.groupby("seed")]
    rows = []
    for name, table in groups:
        if table[by].nunique() < 2:
            continue
        fit = results.critical_batch(table, steps=steps, batch=by, confidence=confidence)
        rows.append({"fit": name, "n_points": fit.n_points, "b_crit": fit.b_crit,
                     "b_crit_low": fit.b_crit_interval[0], "b_crit_high": fit.b_crit_interval[1],
                     "b_crit_std_error": fit.b_crit_std_error, "s_min": fit.s_min,
                     "s_min_low": fit.s_min_interval[0], "s_min_high": fit.s_min_interval[1],
                     "e_min": fit.e_min, "e_min_std_error": fit.e_min_std_error,
                     "rms_log_residual": fit.rms_log_residual, "confidence": fit.confidence})
    return pd.DataFrame(rows)


def regime_boundaries(b_crit: float, perfect: float = PERFECT_EXPONENT,
                      maximal: float = MAXIMAL_EXPONENT) -> tuple[float, float]:
    """The batch sizes where the fitted curve's scaling exponent B_crit/(B + B_crit) equals `perfect` and
    `maximal`: below the first, "perfect scaling"; above the second, "maximal data parallelism"."""
    if not 0 < maximal < perfect < 1:
        raise ConfigError(f"regime exponents must satisfy 0 < maximal < perfect < 1; got {maximal}, {perfect}")
    return b_crit * (1 - perfect) / perfect, b_crit * (1 - maximal) / maximal


def regime_of(batch_size: float | Sequence[float], b_crit: float, perfect: float = PERFECT_EXPONENT,
              maximal: float = MAXIMAL_EXPONENT) -> list[str]:
    """The regime (one of REGIMES) of each batch size on the fitted curve."""
    low, high = regime_boundaries(b_crit, perfect, maximal)
    low, high = low * (1 + 1e-9), high * (1 - 1e-9)  # a batch size on a boundary belongs to the outer regime
    sizes = np.atleast_1d(np.asarray(batch_size, dtype=float))
    return [REGIMES[0] if b <= low else REGIMES[2] if b >= high else REGIMES[1] for b in sizes]


def exponent_regime(exponent: float, perfect: float = PERFECT_EXPONENT, maximal: float = MAXIMAL_EXPONENT) -> str:
    """The regime a measured scaling exponent -dlog S/dlog B falls in (the same thresholds as the fit's)."""
    if not math.isfinite(exponent):
        return "unknown"
    return REGIMES[0] if exponent >= perfect else REGIMES[2] if exponent <= maximal else REGIMES[1]


def local_exponents(table: pd.DataFrame, steps: str = "steps_mean", by: str = "batch_size",
                    b_crit: float | None = None) -> pd.DataFrame:
    """The measured scaling exponent -log(S_2/S_1)/log(B_2/B_1) between neighbouring batch sizes of `table`
    (e.g. tuned_table's steps_mean): 1 is perfect scaling, 0 no gain. Columns: b_small, b_large, s_small,
    s_large, exponent, regime (by the measured exponent), and with b_crit the fitted curve's exponent at the
    pair's geometric mean (fitted_exponent) and its regime (fitted_regime)."""
    data = table[[by, steps]].apply(pd.to_numeric, errors="coerce").dropna().sort_values(by)
    b, s = data[by].to_numpy(float), data[steps].to_numpy(float)
    rows = []
    for b1, b2, s1, s2 in zip(b[:-1], b[1:], s[:-1], s[1:]):
        exponent = -math.log(s2 / s1) / math.log(b2 / b1)
        row = {"b_small": b1, "b_large": b2, "s_small": s1, "s_large": s2, "exponent": exponent,
               "regime": exponent_regime(exponent)}
        if b_crit is not None:
            mid = math.sqrt(b1 * b2)
            row["fitted_exponent"] = b_crit / (mid + b_crit)
            row["fitted_regime"] = regime_of(mid, b_crit)[0]
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class LrFit:
    """The tuned lr against batch size fitted by eps(B) = eps_max / (1 + B_lr/B) (McCandlish et al.'s
    eps_opt with B_lr in the place of B_noise), on log eps; intervals at `confidence`."""
    eps_max: float
    b_lr: float                          # examples
    eps_max_interval: tuple[float, float]
    b_lr_interval: tuple[float, float]
    n_points: int
    rms_log_residual: float
    confidence: float

    def predict(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        return self.eps_max / (1 + self.b_lr / np.asarray(batch_size, dtype=float))


def fit_tuned_lr(table: pd.DataFrame, lr: str = "lr", by: str = "batch_size", confidence: float = 0.95) -> LrFit:
    """Fit eps(B) = eps_max/(1 + B_lr/B) to the best lr per batch size (rows with interior == False, whose
    optimum may lie beyond the grid, are left out when the column is there). 1/eps = (1/eps_max)(1 + B_lr/B)
    has the form of S(B), so this is the critical-batch fit applied to 1/eps. The best lrs sit on a factor-2
    grid, so the fit is coarse: read B_lr to within a factor of ~2."""
    data = table[table["interior"].astype(bool)] if "interior" in table else table
    if data[by].nunique() < 2:
        raise ConfigError(f"the tuned-lr fit needs interior best lrs at 2 or more batch sizes; got {len(data)}")
    fit = fit_critical_batch(data[by].to_numpy(float), 1.0 / data[lr].to_numpy(float), confidence)
    return LrFit(eps_max=1 / fit.s_min, b_lr=fit.b_crit,
                 eps_max_interval=(1 / fit.s_min_interval[1], 1 / fit.s_min_interval[0]),
                 b_lr_interval=fit.b_crit_interval, n_points=fit.n_points,
                 rms_log_residual=fit.rms_log_residual, confidence=confidence)


# ----------------------------------------------------------------------------- the two-stage design and the tests
SELECTION_SEEDS = (1, 2)       # the best lr of a batch size is chosen on these (docs/protocols.md#steps-to-target)
MIN_REACHED = 3                # a batch size where fewer seeds reached the target is left out of the fit
MIN_BATCH_SIZES = 6            # validity: batch sizes in the fit
NOISE_RATIO_RANGE = (0.1, 10.0)  # r = B_simple,target / B_crit must lie within this (McCandlish: "order of magnitude")


def add_confirmation_seeds(per_seed: pd.DataFrame, confirmation: pd.DataFrame | None, best: pd.DataFrame,
                           by: str = "batch_size", lr: str = "lr") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The selection runs at their best lr (at_best_lr) plus the confirmation seeds' runs (the seeds sweep, one
    lr per batch size) that were run at that best lr. Returns (runs with a `stage` column, "selection" or
    "confirmation"; mismatches: one row per batch size whose confirmation runs used another lr, with
    lr_run, lr_best and n_runs, those runs being left out)."""
    selection = per_seed.assign(stage="selection")
    empty = pd.DataFrame(columns=[by, "lr_run", "lr_best", "n_runs"])
    if confirmation is None or not len(confirmation):
        return selection, empty
    best_lr = best.set_index(by)[lr]
    chosen = confirmation[by].map(best_lr)
    keep = confirmation[np.isclose(confirmation[lr].astype(float), chosen.astype(float))]
    off = confirmation[~confirmation.index.isin(keep.index)]
    mismatches = (off.groupby([by, lr]).size().rename("n_runs").reset_index().rename(columns={lr: "lr_run"})
                  .assign(lr_best=lambda d: d[by].map(best_lr)))[[by, "lr_run", "lr_best", "n_runs"]]
    runs = pd.concat([selection, keep.assign(stage="confirmation")], ignore_index=True)
    return runs.sort_values([by, "seed"]).reset_index(drop=True), (mismatches if len(mismatches) else empty)


def lr_chosen_elsewhere(runs: pd.DataFrame, chosen: pd.DataFrame, by: str = "batch_size", lr: str = "lr",
                        confidence: float = 0.95) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The confirmatory design (protocol version 3): each batch size's lr was chosen on another sweep's
    selection seeds, whose report wrote `chosen` (its tuned_lr.csv: `by`, lr, interior, lr_min, lr_max,
    n_lrs), and `runs` (fresh seeds) ran at that lr only, so nothing is selected here. Returns (tuned: as
    tuned_table over the runs at the chosen lr, with interior, lr_min, lr_max and n_lrs those of the
    selection's grid; per_seed: those runs, stage "confirmation"; mismatches: as add_confirmation_seeds,
    the runs at another lr or at a batch size `chosen` lacks, left out)."""
    grid = ["interior", "lr_min", "lr_max", "n_lrs"]
    missing = [c for c in [by, lr, *grid] if c not in chosen.columns]
    if missing:
        raise ConfigError(f"the table of chosen lrs lacks the column(s) {missing}; it must be a steps-to-target "
                          f"report's tuned_lr.csv (columns {by}, {lr}, {', '.join(grid)}, ...)")
    empty = runs.iloc[0:0].assign(stage=pd.Series(dtype=object))
    per_seed, mismatches = add_confirmation_seeds(empty, runs, chosen[[by, lr]], by=by, lr=lr)
    if not len(per_seed):
        raise ConfigError(f"no run is at the lr the table chose for its {by}: the sweep and the table of chosen "
                          f"lrs do not belong together")
    tuned = tuned_table(per_seed, by=by, lr=lr, confidence=confidence)   # one lr per batch size: the chosen one
    tuned = tuned.drop(columns=grid).merge(chosen[[by, *grid]], on=by)
    return tuned[[by, lr, *grid, *[c for c in tuned.columns if c not in (by, lr, *grid)]]], per_seed, mismatches


def fit_points(per_seed: pd.DataFrame, steps: str = "steps_to_target", by: str = "batch_size",
               min_reached: int = MIN_REACHED) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The protocol's points of the B_crit fit from the runs at the best lr: a run that did not reach the
    target (diverged or capped: no steps) is left out, and a batch size where fewer than `min_reached` seeds
    reached it is left out altogether. Returns (points: the rows that enter the fit; per batch size:
    n_seeds, n_reached, in_fit)."""
    reached = pd.to_numeric(per_seed[steps], errors="coerce").notna()
    counts = per_seed.assign(_reached=reached).groupby(by).agg(n_seeds=("seed", "size"), n_reached=("_reached", "sum"))
    counts["n_reached"] = counts["n_reached"].astype(int)
    counts["in_fit"] = counts["n_reached"] >= min_reached
    points = per_seed[reached & per_seed[by].map(counts["in_fit"]).astype(bool)]
    return points.reset_index(drop=True), counts.reset_index()


@dataclass(frozen=True)
class CriticalBatchTest(PreregisteredTest):
    """The pre-registered steps-to-target test (docs/protocols.md#steps-to-target): B_crit's interval against
    [4 B_min, B_max/4], B_min and B_max the smallest and largest batch sizes in the fit."""
    b_crit: float
    b_crit_low: float
    b_crit_high: float
    lower: float                # 4 B_min
    upper: float                # B_max / 4
    n_batch_sizes: int
    all_interior: bool          # every best lr strictly inside its grid
    valid: bool
    verdict: Verdict
    reason: str                 # why, in words


def critical_batch_test(fit: CriticalBatchFit, batch_sizes: Sequence[float], all_interior: bool,
                        min_batch_sizes: int = MIN_BATCH_SIZES) -> CriticalBatchTest:
    """The verdict of the steps-to-target test from the fit on the protocol's points (fit_points) and the
    batch sizes in it: reproduced if B_crit's interval lies within [4 B_min, B_max/4], partly if only the
    point does, not reproduced if the point does not; not testable when a best lr is on its grid's edge or
    fewer than `min_batch_sizes` batch sizes are in the fit."""
    sizes = sorted({float(b) for b in batch_sizes})
    lower, upper = 4 * sizes[0], sizes[-1] / 4
    low, high = fit.b_crit_interval
    problems = ([] if all_interior else ["a best lr is on its grid's edge"]) + (
        [] if len(sizes) >= min_batch_sizes else [f"{len(sizes)} batch sizes in the fit (< {min_batch_sizes})"])
    inside = f"[4 B_min, B_max/4] = [{lower:.3g}, {upper:.3g}]"
    if problems:
        verdict, reason = Verdict.NOT_TESTABLE, "; ".join(problems)
    elif not lower <= fit.b_crit <= upper:
        verdict, reason = Verdict.NOT_REPRODUCED, f"B_crit {fit.b_crit:.3g} outside {inside}"
    elif lower <= low and high <= upper:
        verdict, reason = Verdict.REPRODUCED, f"B_crit's interval [{low:.3g}, {high:.3g}] within {inside}"
    else:
        verdict, reason = (Verdict.PARTLY,
                           f"B_crit {fit.b_crit:.3g} within {inside}, its interval [{low:.3g}, {high:.3g}] not")
    return CriticalBatchTest(fit.b_crit, low, high, lower, upper, len(sizes), all_interior, not problems, verdict,
                             reason)


@dataclass(frozen=True)
class NoiseRatioTest(PreregisteredTest):
    """The pre-registered noise-scale test (docs/protocols.md#steps-to-target-noise): r = B_simple,target /
    B_crit, B_simple,target = mean tr(Sigma) / mean |G|^2 over the fit's runs at their target weights."""
    b_simple: float
    n_runs: int
    ratio: float
    ratio_low: float            # B_simple / B_crit,high
    ratio_high: float           # B_simple / B_crit,low
    lower: float
    upper: float
    verdict: Verdict
    reason: str


def noise_ratio_test(at_weights: pd.DataFrame, b_crit: CriticalBatchTest,
                     bounds: tuple[float, float] = NOISE_RATIO_RANGE) -> NoiseRatioTest:
    """r and its interval [B_simple / B_crit,high, B_simple / B_crit,low] against `bounds`: reproduced if r
    and both ends lie within, partly if r does, not reproduced if not; not testable when the B_crit test is
    (`at_weights`: one row per run of the fit with trace_cov and grad_sq_norm at its target weights)."""
    b_simple = float(at_weights["trace_cov"].mean() / at_weights["grad_sq_norm"].mean())
    ratio = b_simple / b_crit.b_crit
    low = b_simple / b_crit.b_crit_high if b_crit.b_crit_high > 0 else math.nan
    high = b_simple / b_crit.b_crit_low if b_crit.b_crit_low > 0 else math.inf
    lo, hi = bounds
    inside = f"[{lo:g}, {hi:g}]"
    if not b_crit.valid:
        verdict, reason = Verdict.NOT_TESTABLE, f"the B_crit test is not testable ({b_crit.reason})"
    elif not lo <= ratio <= hi:
        verdict, reason = Verdict.NOT_REPRODUCED, f"r = {ratio:.3g} outside {inside}"
    elif lo <= low and high <= hi:
        verdict, reason = (Verdict.REPRODUCED,
                           f"r = {ratio:.3g} and its interval [{low:.3g}, {high:.3g}] within {inside}")
    else:
        verdict, reason = Verdict.PARTLY, f"r = {ratio:.3g} within {inside}, its interval [{low:.3g}, {high:.3g}] not"
    return NoiseRatioTest(b_simple, len(at_weights), ratio, low, high, lo, hi, verdict, reason)


def largest_batch_fraction(runs: pd.DataFrame) -> tuple[float, int, int]:
    """(B/N, B, N) for the largest batch size of `runs`, N the training examples (n_train)."""
    b = int(runs["batch_size"].max())
    n = int(runs.loc[runs["batch_size"] == b, "n_train"].iloc[0])
    return b / n, b, n


# ----------------------------------------------------------------------------- B_crit at several targets
def steps_at_targets(history: pd.DataFrame, targets: Sequence[float], loss: str = "train_loss") -> pd.DataFrame:
    """Per run (of load_history) and target: steps_to_target = the step of the first evaluation with `loss`
    <= target (no interpolation; NaN if none: diverged, capped, or the run stopped at a tighter target
    first, which cannot happen for a looser one). Columns: run_id, batch_size, lr (the config's), seed,
    target, steps_to_target."""
    frames = []
    for target in targets:
        table = results.to_target(history, float(target), loss)
        table = table.drop(columns=["lr"], errors="ignore").rename(columns={"config_lr": "lr"})  # the config's lr
        frames.append(table[["run_id", "batch_size", "lr", "seed",
                                                                   "target", "steps_to_target"]])
    return pd.concat(frames, ignore_index=True)


def b_crit_by_target(steps: pd.DataFrame, selection_seeds: Sequence[int] = SELECTION_SEEDS,
                     confidence: float = 0.95, min_reached: int = MIN_REACHED) -> pd.DataFrame:
    """Per target of steps_at_targets: the best lr per batch size by the same rule (fewest mean steps over
    the selection seeds, failures worst), the runs of every seed at it, the protocol's points (fit_points) and
    the fit. Columns: target, b_crit, b_crit_low, b_crit_high, s_min, rms_log_residual, n_points,
    n_batch_sizes, all_interior (NaN fit values with fewer than 2 batch sizes)."""
    rows = []
    for target, group in steps.groupby("target", sort=True):
        best = stats.best_lr(group[group["seed"].isin(selection_seeds)], "steps_to_target", minimize=True)
        points, _ = fit_points(at_best_lr(group, best), min_reached=min_reached)
        row = {"target": target, "n_points": len(points), "n_batch_sizes": points["batch_size"].nunique(),
               "all_interior": bool(best["interior"].all()), "b_crit": math.nan, "b_crit_low": math.nan,
               "b_crit_high": math.nan, "s_min": math.nan, "rms_log_residual": math.nan}
        if row["n_batch_sizes"] >= 2:
            fit = results.critical_batch(points, confidence=confidence)
            row.update(b_crit=fit.b_crit, b_crit_low=fit.b_crit_interval[0], b_crit_high=fit.b_crit_interval[1],
                       s_min=fit.s_min, rms_log_residual=fit.rms_log_residual)
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the noise scale along training
NOISE_COLUMNS = {"noise_b_simple": "b_simple", "noise_b_noise": "b_noise",
                 "noise_b_noise_std_error": "b_noise_std_error", "noise_trace_cov": "trace_cov",
                 "noise_grad_sq_norm": "grad_sq_norm"}


def noise_checkpoints(runs: pd.DataFrame) -> pd.DataFrame:
    """Tidy table of noise-scale measurements taken at the end of fixed-step runs (the `noise_scale`
    measurement: exact B_simple over the training set, B_noise with its Hutchinson standard error).

    Runs of one seed and constant lr that differ only in their step budget follow one trajectory, so
    their ends are checkpoints of it. Columns: batch_size, lr, seed, step, examples, train_loss, test_acc,
    b_simple, b_noise, b_noise_std_error, trace_cov, grad_sq_norm; sorted by seed and step. Runs without
    the measurement (or not ok) are left out.
    """
    ok = results.finished(runs)
    if "noise_b_simple" not in ok:
        return pd.DataFrame(columns=["batch_size", "lr", "seed", "step", "train_loss", *NOISE_COLUMNS.values()])
    ok = ok[ok["noise_b_simple"].notna()]
    keep = ["batch_size", "lr", "seed", "steps", "examples", "train_loss", "test_acc", *NOISE_COLUMNS]
    table = ok[[c for c in keep if c in ok]].rename(columns={"steps": "step", **NOISE_COLUMNS})
    return table.sort_values(["seed", "step"]).reset_index(drop=True)


def value_at_loss(table: pd.DataFrame, target: float, value: str = "b_simple", loss: str = "train_loss",
                  step: str = "step", by: str = "seed") -> pd.DataFrame:
    """Per `by` group (seed): `value` where the run first crossed `loss` <= target, interpolated linearly in
    log(value) against log(loss) between the last checkpoint above the target and the first at or below it.

    Columns: `by`, step_before, step_after, loss_before, loss_after, `value`. NaN when the run never
    crossed (or was already below the target at its first checkpoint: nothing to interpolate from).
    """
    rows = []
    for key, group in table.sort_values(step).groupby(by, sort=True):
        losses, values = group[loss].to_numpy(float), group[value].to_numpy(float)
        below = np.flatnonzero(losses <= target)
        row = {by: key, "step_before": math.nan, "step_after": math.nan, "loss_before": math.nan,
               "loss_after": math.nan, value: math.nan}
        if len(below) and below[0] > 0:
            i, j = below[0] - 1, below[0]
            row.update(step_before=group[step].iloc[i], step_after=group[step].iloc[j],
                       loss_before=losses[i], loss_after=losses[j])
            if losses[i] == losses[j]:
                row[value] = values[j]
            else:
                t = (math.log(target) - math.log(losses[i])) / (math.log(losses[j]) - math.log(losses[i]))
                row[value] = math.exp(math.log(values[i]) + t * (math.log(values[j]) - math.log(values[i])))
        rows.append(row)
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- the noise scale under every summary (v4)
NOISE_SUMMARIES = ("ratio_of_means", "mean", "median", "geometric_mean")   # the first is McCandlish's and the primary's
TWO_BATCH_TOLERANCE = 1.25     # the two-batch estimate agrees with the exact one within a factor of this
TWO_BATCH_MIN_SHARE = 0.75     # ... at this share of the points, for "agrees"


def b_simple_summaries(at_weights: pd.DataFrame) -> dict[str, float]:
    """B_simple over runs measured at their target weights (one row per run: trace_cov, grad_sq_norm), under
    each of NOISE_SUMMARIES: ratio_of_means = mean tr(Sigma) / mean |G|^2 (McCandlish et al.: numerator and
    denominator averaged first; the protocol's B_simple,target); mean, median and geometric_mean of the
    per-run ratios tr(Sigma) / |G|^2 (a run with |G|^2 <= 0 has B_simple = inf)."""
    trace = at_weights["trace_cov"].to_numpy(float)
    grad = at_weights["grad_sq_norm"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_run = np.where(grad > 0, trace / grad, np.inf)
        geometric = float(np.exp(np.mean(np.log(per_run)))) if len(per_run) else math.nan
    mean_grad = float(grad.mean()) if len(grad) else math.nan
    return {"ratio_of_means": float(trace.mean()) / mean_grad if mean_grad > 0 else math.inf,
            "mean": float(per_run.mean()) if len(per_run) else math.nan,
            "median": float(np.median(per_run)) if len(per_run) else math.nan,
            "geometric_mean": geometric}


def noise_ratio_summaries(at_weights: pd.DataFrame, points: pd.DataFrame, steps: str = "steps_to_target",
                          by: str = "batch_size", seed: str = "seed", n_boot: int = 2000, boot_seed: int = 0,
                          confidence: float = 0.95) -> pd.DataFrame:
    """r = B_simple / B_crit under each of NOISE_SUMMARIES, with two intervals.

    B_crit is fitted to `points` (the protocol's fit points: batch size, seed, steps); `at_weights` holds the
    same runs' tr(Sigma) and |G|^2 at their target weights. ratio_low/ratio_high: a percentile bootstrap over
    seeds (`n_boot` resamples of the seeds with replacement, NumPy generator seeded `boot_seed`; a seed keeps
    all its runs; B_crit is refitted and the summary recomputed in each; order statistics, so an inf end stays
    inf; a resample whose fit fails is left out and counted in n_boot_failed). fit_low/fit_high: the
    protocol's v1 form, the summary over B_crit's fit interval (B_crit's uncertainty only). Columns: summary,
    b_simple, b_crit, ratio, ratio_low, ratio_high, fit_low, fit_high, n_runs, n_seeds, n_boot_failed."""
    for column in ("trace_cov", "grad_sq_norm", seed):
        if column not in at_weights:
            raise ConfigError(f"noise_ratio_summaries: at_weights has no column {column!r}")
    fit = results.critical_batch(points, steps=steps, batch=by, confidence=confidence)
    values = b_simple_summaries(at_weights)
    seeds = np.array(sorted(points[seed].unique()))
    by_seed = {s: (points[points[seed] == s], at_weights[at_weights[seed] == s]) for s in seeds}
    rng = np.random.default_rng(boot_seed)
    boots: dict[str, list[float]] = {k: [] for k in NOISE_SUMMARIES}
    failed = 0
    for _ in range(n_boot):
        pick = rng.choice(seeds, size=len(seeds), replace=True)
        pts = pd.concat([by_seed[s][0] for s in pick], ignore_index=True)
        weights = pd.concat([by_seed[s][1] for s in pick], ignore_index=True)
        try:
            b_crit = results.critical_batch(pts, steps=steps, batch=by, confidence=confidence).b_crit
        except (ConfigError, ValueError, np.linalg.LinAlgError):
            failed += 1
            continue
        for name, value in b_simple_summaries(weights).items():
            boots[name].append(value / b_crit)
    tail = (1 - confidence) / 2
    low_crit, high_crit = fit.b_crit_interval
    rows = []
    for name in NOISE_SUMMARIES:
        reps = np.array(boots[name], dtype=float)
        low, high = (np.quantile(reps, [tail, 1 - tail], method="inverted_cdf") if len(reps)
                     else (math.nan, math.nan))
        rows.append({"summary": name, "b_simple": values[name], "b_crit": fit.b_crit,
                     "ratio": values[name] / fit.b_crit, "ratio_low": float(low), "ratio_high": float(high),
                     "fit_low": values[name] / high_crit if high_crit > 0 else math.nan,
                     "fit_high": values[name] / low_crit if low_crit > 0 else math.inf,
                     "n_runs": len(at_weights), "n_seeds": len(seeds), "n_boot_failed": failed})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class NoiseSummaryTest(PreregisteredTest):
    """The noise-scale mechanism test (docs/protocols.md, protocol v4): r under every summary."""
    table: pd.DataFrame      # noise_ratio_summaries, with `inside` (r and its bootstrap interval within bounds)
    lower: float
    upper: float
    verdict: Verdict
    reason: str


def noise_summary_test(table: pd.DataFrame, b_crit: CriticalBatchTest | None = None,
                       bounds: tuple[float, float] = NOISE_RATIO_RANGE) -> NoiseSummaryTest:
    """reproduced: r and its bootstrap interval lie within `bounds` under every summary; partly: they do for
    ratio_of_means (McCandlish's estimator) but not under some other summary, or r of ratio_of_means lies
    within and its interval does not; not reproduced: r of ratio_of_means lies outside; not testable: the
    B_crit test (if given) is not valid, or an interval could not be computed."""
    lo, hi = bounds
    inside_r = (table["ratio"] >= lo) & (table["ratio"] <= hi)
    inside = inside_r & (table["ratio_low"] >= lo) & (table["ratio_high"] <= hi)
    out = table.assign(inside=inside)
    primary = out.set_index("summary").loc["ratio_of_means"]
    others = out[(out["summary"] != "ratio_of_means") & ~out["inside"]]["summary"].tolist()
    if b_crit is not None and not b_crit.valid:
        verdict, reason = Verdict.NOT_TESTABLE, f"the B_crit test is not testable ({b_crit.reason})"
    elif bool(out[["ratio_low", "ratio_high"]].isna().to_numpy().any()):
        verdict, reason = Verdict.NOT_TESTABLE, "a summary has no bootstrap interval"
    elif not lo <= primary["ratio"] <= hi:
        verdict, reason = (Verdict.NOT_REPRODUCED,
                           f"r (ratio of means) = {primary['ratio']:.3g} outside [{lo:g}, {hi:g}]")
    elif bool(out["inside"].all()):
        verdict, reason = Verdict.REPRODUCED, f"r and its interval within [{lo:g}, {hi:g}] under every summary"
    elif not bool(primary["inside"]):
        verdict, reason = Verdict.PARTLY, (f"r (ratio of means) = {primary['ratio']:.3g} within [{lo:g}, {hi:g}], its "
                                           f"interval [{primary['ratio_low']:.3g}, {primary['ratio_high']:.3g}] not")
    else:
        verdict, reason = Verdict.PARTLY, f"ratio of means within [{lo:g}, {hi:g}]; not under {', '.join(others)}"
    return NoiseSummaryTest(out, lo, hi, verdict, reason)


def near_loss(table: pd.DataFrame, target: float, factor: float = 2.0, loss: str = "train_loss") -> pd.DataFrame:
    """The rows (checkpoints) whose `loss` lies within a factor `factor` of `target`: target / factor <= loss <=
    target x factor ("near the target", where B_simple is read)."""
    values = pd.to_numeric(table[loss], errors="coerce")
    return table[(values >= target / factor) & (values <= target * factor)]


@dataclass(frozen=True)
class TwoBatchAgreement:
    """The two-batch B_simple against the exact one at the same weights (docs/protocols.md, protocol v4)."""
    n: int                   # points compared
    n_within: int            # two-batch / exact within [1/tolerance, tolerance] (a non-finite or <= 0 estimate is not)
    share_within: float
    n_nonfinite: int         # two-batch estimates that are inf, NaN or <= 0 (a pair mean |G|^2 <= 0)
    geo_ratio: float         # exp(mean over seeds of the per-seed mean log(two-batch / exact)), finite ratios only
    geo_low: float           # t interval over seeds, back on the ratio scale
    geo_high: float
    n_seeds: int
    tolerance: float
    min_share: float
    agrees: bool             # share_within >= min_share and [geo_low, geo_high] within [1/tolerance, tolerance]
    table: pd.DataFrame      # the input with ratio and within


def two_batch_agreement(table: pd.DataFrame, exact: str = "exact", estimate: str = "two_batch", seed: str = "seed",
                        tolerance: float = TWO_BATCH_TOLERANCE, min_share: float = TWO_BATCH_MIN_SHARE,
                        confidence: float = 0.95) -> TwoBatchAgreement:
    """How closely the two-batch estimate follows the exact B_simple at the points of `table` (one row per
    point: `exact`, `estimate`, `seed`), e.g. every fitted run's target weights, or near_loss of a run's
    checkpoints. The geometric-mean ratio's interval is a t interval over the seeds' mean log ratios."""
    for column in (exact, estimate, seed):
        if column not in table:
            raise ConfigError(f"two_batch_agreement: no column {column!r}")
    ex = pd.to_numeric(table[exact], errors="coerce").to_numpy(float)
    est = pd.to_numeric(table[estimate], errors="coerce").to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isfinite(est) & (est > 0) & (ex > 0), est / ex, np.nan)
    within = np.isfinite(ratio) & (np.abs(np.log(np.where(np.isfinite(ratio), ratio, 1.0))) <= math.log(tolerance))
    out = table.assign(ratio=ratio, within=within)
    logs = out.assign(_log=np.log(ratio)).dropna(subset=["_log"]).groupby(seed)["_log"].mean()
    mean, _, low, high = stats.t_interval(logs.to_numpy(float), confidence)
    n = len(out)
    share = float(within.sum() / n) if n else math.nan
    geo, geo_low, geo_high = (math.exp(v) if math.isfinite(v) else math.nan for v in (mean, low, high))
    agrees = bool(n and share >= min_share and math.isfinite(geo_low) and 1 / tolerance <= geo_low
                  and geo_high <= tolerance)
    return TwoBatchAgreement(n, int(within.sum()), share, int((~np.isfinite(ratio)).sum()), geo, geo_low, geo_high,
                             len(logs), tolerance, min_share, agrees, out)
