"""The critical batch size measured by branching (Merrill, Arora, Groeneveld & Hajishirzi 2025). No torch.

    branches = branch_losses(runs)          # one row per (seed, checkpoint, k): its loss, L_1, the ratio
    cbs = critical_batch_sizes(branches)    # one row per (seed, checkpoint): the CBS
    test = cbs_test(cbs)                    # D and G over seeds, the verdict
    table = cbs_by_checkpoint(cbs, runs)    # per checkpoint: the CBS's geometric mean and B_simple, intervals
    figures.cbs_vs_tokens(ax, table, cbs)           # the figure: both against tokens trained, on one axis

The runs are those of a branching sweep (experiments/lm_cbs.yaml, or a copy of it for any model): a branch is
a run with `batch_schedule: tokens` and one change (`batch_at_tokens: [T0]`, `batch_sizes: [k B0]`) from the
trajectory at batch B0 = its `batch_size`; a measurement run has a constant batch and a budget that ends at a
checkpoint, and `noise_b_simple` in its metrics. Nothing here knows the model: the loss is the runs' final
`test_loss` (any loss, in the runs' own units). Setting and pre-registered test: docs/protocols.md#lm-cbs.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.lm_cbs (`figures` above).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import stats
from ..config import ConfigError
from ..rundir import FINISHED_STATES as FINISHED  # the end states of a run that count (others are rerun)
from .verdict import PreregisteredTest, Verdict

EPS = 0.01          # a branch keeps up when its loss is at most (1 + EPS) x that of the original batch size


def _first(value: object) -> float:
    """The first element of a tuple-valued config column (a one-change schedule), NaN otherwise."""
    return float(value[0]) if isinstance(value, (tuple, list)) and len(value) else math.nan


def branch_losses(runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """One row per branch: seed, checkpoint (tokens T0), b0 (the trajectory's batch), k, batch (k b0), state,
    loss (`metric` at the end of its window; +inf for a branch that diverged or ended without a finite loss,
    NaN for one that has not finished), and loss_1 and ratio = loss / loss_1 (against the branch at k = 1 of
    the same seed and checkpoint; NaN where that one has no finite loss)."""
    for column in ("batch_schedule", "batch_at_tokens", "batch_sizes", "batch_size", "seed", "state", metric):
        if column not in runs:
            raise ConfigError(f"branching analysis: the runs table has no column {column!r}")
    rows = runs[runs["batch_schedule"] == "tokens"]
    if rows.empty:
        raise ConfigError("branching analysis: no branch among the runs (a run with batch_schedule tokens)")
    loss = pd.to_numeric(rows[metric], errors="coerce")
    finite = rows["state"].eq("ok") & np.isfinite(loss)
    lost = rows["state"].isin(FINISHED) & ~finite      # diverged, or ended without a finite loss
    out = pd.DataFrame({
        "seed": rows["seed"].astype(int).to_numpy(),
        "checkpoint": rows["batch_at_tokens"].map(_first).to_numpy(),
        "b0": rows["batch_size"].astype(int).to_numpy(),
        "batch": rows["batch_sizes"].map(_first).to_numpy(),
        "state": rows["state"].to_numpy(),
        "loss": np.where(finite, loss, np.where(lost, np.inf, np.nan))})   # NaN: not finished (no verdict)
    out["k"] = out["batch"] / out["b0"]
    base = out[(out["k"] == 1) & np.isfinite(out["loss"])].set_index(["seed", "checkpoint"])["loss"]
    out["loss_1"] = [base.get((s, c), math.nan) for s, c in zip(out["seed"], out["checkpoint"])]
    out["ratio"] = out["loss"] / out["loss_1"]
    return out.sort_values(["seed", "checkpoint", "k"]).reset_index(drop=True)


def critical_batch_sizes(branches: pd.DataFrame, eps: float = EPS) -> pd.DataFrame:
    """Per (seed, checkpoint): cbs = k* b0, k* the largest k such that every branch at j <= k has a loss at
    most (1 + eps) L_1 (a diverged branch never keeps up); censored when even the largest k tried keeps up
    (the CBS is at least that), and complete when every branch of the checkpoint finished."""
    out = []
    for (seed, checkpoint), g in branches.groupby(["seed", "checkpoint"], sort=True):
        g = g.sort_values("k")
        keeps = (g["ratio"] <= 1 + eps).to_numpy()   # NaN (no finite L_1) never keeps up
        first_miss = len(keeps) if keeps.all() else int(np.argmin(keeps))
        k_star = float(g["k"].iloc[first_miss - 1]) if first_miss > 0 else math.nan
        out.append({"seed": seed, "checkpoint": checkpoint, "b0": int(g["b0"].iloc[0]),
                    "cbs": k_star * int(g["b0"].iloc[0]), "largest": float(g["batch"].max()),
                    "censored": bool(keeps.all()), "complete": bool(g["state"].isin(FINISHED).all()),
                    "has_k1": bool((g["k"] == 1).any())})
    table = pd.DataFrame(out)
    table["log2_cbs"] = np.log2(table["cbs"])
    return table


@dataclass(frozen=True)
class CBSTest(PreregisteredTest):
    """The pre-registered test (docs/protocols.md#lm-cbs): growth of log2 CBS over seeds."""
    first: float              # checkpoints compared (tokens)
    before_last: float
    last: float
    d: float                  # mean over seeds of log2 CBS(last) - log2 CBS(first)
    d_low: float
    d_high: float
    g: float                  # mean over seeds of log2 CBS(last) - log2 CBS(before_last)
    g_low: float
    g_high: float
    n_seeds: int
    verdict: Verdict
    problems: tuple[str, ...] = ()


def _paired(values: list[float]) -> tuple[float, float, float]:
    """Mean and t interval; a single repeated value (no spread over seeds) is its own interval."""
    mean, std, low, high = stats.t_interval(values)
    if len(values) >= 2 and std == 0:
        return mean, mean, mean
    return mean, low, high


def cbs_test(cbs: pd.DataFrame) -> CBSTest:
    """D = log2 CBS(last checkpoint) - log2 CBS(first), G = log2 CBS(last) - log2 CBS(the one before),
    per seed, with paired t intervals over the seeds. Reproduced when D's interval lies above 0 and G's upper
    end is below 1; partly when only D's lies above 0; not reproduced when D's reaches 0. Not testable when a
    branch did not finish, a checkpoint lacks its k = 1 branch, fewer than 2 seeds have every checkpoint, or
    the CBS at the last checkpoint is censored (the largest batch tried keeps up) for half the seeds or more."""
    checkpoints = sorted(cbs["checkpoint"].unique())
    if len(checkpoints) < 3:
        raise ConfigError(f"the branching test needs at least 3 checkpoints; got {len(checkpoints)}")
    first, before_last, last = checkpoints[0], checkpoints[-2], checkpoints[-1]
    wide = cbs.pivot(index="seed", columns="checkpoint", values="log2_cbs").dropna()
    d_values = (wide[last] - wide[first]).tolist()
    g_values = (wide[last] - wide[before_last]).tolist()
    d, d_low, d_high = _paired(d_values)
    g, g_low, g_high = _paired(g_values)
    problems = [f"seed {r.seed} checkpoint {r.checkpoint:g}: a branch did not finish"
                for r in cbs.itertuples() if not r.complete]
    problems += [f"seed {r.seed} checkpoint {r.checkpoint:g}: no k = 1 branch"
                 for r in cbs.itertuples() if not r.has_k1]
    at_last = cbs[cbs["checkpoint"] == last]
    if at_last["censored"].sum() * 2 >= len(at_last):
        problems.append(f"the CBS at {last:g} tokens is the largest batch tried for {int(at_last['censored'].sum())} "
                        f"of {len(at_last)} seeds: extend the branches (protocol)")
    if len(wide) < 2:
        problems.append(f"{len(wide)} seed(s) with every checkpoint")
    if problems or not math.isfinite(d_low):
        verdict = Verdict.NOT_TESTABLE
    elif d_low <= 0:
        verdict = Verdict.NOT_REPRODUCED
    elif g_high < 1:
        verdict = Verdict.REPRODUCED
    else:
        verdict = Verdict.PARTLY
    return CBSTest(first, before_last, last, d, d_low, d_high, g, g_low, g_high, len(wide), verdict, tuple(problems))


def cbs_by_checkpoint(cbs: pd.DataFrame, runs: pd.DataFrame | None = None, noise: str = "noise_b_simple"
                      ) -> pd.DataFrame:
    """Per checkpoint: n seeds, the geometric mean of the CBS over seeds with its t interval (on log2),
    censored seeds, and, from the measurement runs in `runs` (a constant batch, budget ending at the
    checkpoint, `noise` in the metrics), B_simple's mean with its t interval and the ratio CBS / B_simple."""
    rows = []
    noise_runs = pd.DataFrame()
    if runs is not None and noise in runs:
        noise_runs = runs[(runs["batch_schedule"] == "constant") & runs[noise].notna() & (runs["state"] == "ok")]
    for checkpoint, g in cbs.groupby("checkpoint", sort=True):
        mean, low, high = _paired(g["log2_cbs"].tolist())
        row = {"checkpoint": checkpoint, "n": len(g), "cbs_gmean": 2 ** mean, "cbs_low": 2 ** low,
               "cbs_high": 2 ** high, "censored": int(g["censored"].sum())}
        if not noise_runs.empty:
            at = noise_runs.loc[np.isclose(noise_runs["budget_amount"].astype(float), checkpoint), noise]
            n_mean, _, n_low, n_high = stats.t_interval(at.tolist())
            row.update(b_simple_mean=n_mean, b_simple_low=n_low, b_simple_high=n_high, b_simple_n=len(at),
                       cbs_over_b_simple=2 ** mean / n_mean if n_mean else math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def cbs_by_tolerance(branches: pd.DataFrame, tolerances: Sequence[float] = (0.005, EPS, 0.02)) -> pd.DataFrame:
    """cbs_by_checkpoint at each tolerance eps (a column), the pre-registered EPS among them: how much the CBS
    depends on the tolerance, reported beside a test, never deciding it."""
    return pd.concat([cbs_by_checkpoint(critical_batch_sizes(branches, eps=eps)).assign(eps=eps)
                      for eps in tolerances], ignore_index=True)


def loss_ratios(branches: pd.DataFrame) -> pd.DataFrame:
    """Per (checkpoint, k): the mean over seeds of L_k / L_1 (finite ratios) with its t interval."""
    finite = branches[np.isfinite(branches["ratio"])]
    return stats.summarize(finite, ["checkpoint", "k"], ["ratio"])


# ----------------------------------------------------------------------------- protocol v5: a reference not stalled
STALL_IMPROVEMENT = 2 * EPS   # the reference must improve by at least 2 eps over its window
STALL_BEATEN = EPS / 2        # ... and no larger batch may beat it by more than eps/2 on average


def checkpoint_losses(runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """Per (seed, checkpoint): the trajectory's loss at the checkpoint, read from the measurement run whose
    budget ends there (constant batch schedule, budget_amount = the checkpoint's tokens, ended ok)."""
    for column in ("batch_schedule", "budget_amount", "seed", "state", metric):
        if column not in runs:
            raise ConfigError(f"branching analysis: the runs table has no column {column!r}")
    at = runs[(runs["batch_schedule"] == "constant") & runs["state"].eq("ok")]
    return pd.DataFrame({"seed": at["seed"].astype(int).to_numpy(),
                         "checkpoint": at["budget_amount"].astype(float).to_numpy(),
                         "loss_at_checkpoint": pd.to_numeric(at[metric], errors="coerce").to_numpy()})


def stall_per_seed(branches: pd.DataFrame, at_checkpoints: pd.DataFrame) -> pd.DataFrame:
    """Per (seed, checkpoint): the reference's relative improvement over its window, 1 - L_1(T0 + W) / L(T0), and
    the smallest L_k / L_1 over k >= 2: the values stall_table averages over seeds."""
    ref = branches[branches["k"] == 1][["seed", "checkpoint", "loss"]]
    merged = ref.merge(at_checkpoints, on=["seed", "checkpoint"], how="left")
    merged["improvement"] = 1 - merged["loss"] / merged["loss_at_checkpoint"]
    larger = branches[branches["k"] > 1].groupby(["seed", "checkpoint"])["ratio"].min().rename("min_ratio")
    return merged.merge(larger.reset_index(), on=["seed", "checkpoint"], how="left")


def stall_table(branches: pd.DataFrame, at_checkpoints: pd.DataFrame, eps: float = EPS,
                improvement: float = STALL_IMPROVEMENT, beaten: float = STALL_BEATEN) -> pd.DataFrame:
    """Per checkpoint, over seeds: the reference's (k = 1 branch's) relative improvement over its window,
    1 - L_1(T0 + W) / L(T0), and the smallest L_k / L_1 over k >= 2 (a larger batch that beats the reference).
    stalled: mean improvement < `improvement`, or mean smallest ratio < 1 - `beaten` (protocol v5)."""
    merged = stall_per_seed(branches, at_checkpoints)
    out = []
    for checkpoint, g in merged.groupby("checkpoint", sort=True):
        imp = g["improvement"].replace([np.inf, -np.inf], np.nan).dropna()
        low = g["min_ratio"].replace([np.inf, -np.inf], np.nan).dropna()
        mean_imp = float(imp.mean()) if len(imp) else math.nan
        mean_low = float(low.mean()) if len(low) else math.nan
        stalled = not (mean_imp >= improvement) or (math.isfinite(mean_low) and mean_low < 1 - beaten)
        out.append({"checkpoint": checkpoint, "n": len(g), "improvement": mean_imp, "min_ratio": mean_low,
                    "stalled": bool(stalled)})
    return pd.DataFrame(out)


def stall_intervals(per_seed: pd.DataFrame, improvement: float = STALL_IMPROVEMENT, beaten: float = STALL_BEATEN,
                    confidence: float = 0.95) -> pd.DataFrame:
    """Protocol v6's stall criterion (docs/protocols.md#v6-cbs), judged per checkpoint with its interval, from the
    per-seed values (stall_per_seed's columns; in v6 the improvement is the annealed reference's, 1 - L_1(T0 + W) /
    L_cool(T0)): a checkpoint is stalled only when the t interval's upper end of the improvement is below
    `improvement`, or that of the smallest L_k / L_1 is below 1 - `beaten`; a call near its threshold (an interval
    containing it) is not a stall. Columns as stall_table's plus each interval's ends; long_cbs_test reads it."""
    out = []
    for checkpoint, g in per_seed.groupby("checkpoint", sort=True):
        imp = stats.t_interval(g["improvement"].replace([np.inf, -np.inf], np.nan), confidence)
        ratio = stats.t_interval(g["min_ratio"].replace([np.inf, -np.inf], np.nan), confidence)
        stalled = (math.isfinite(imp[3]) and imp[3] < improvement) or \
            (math.isfinite(ratio[3]) and ratio[3] < 1 - beaten)
        out.append({"checkpoint": checkpoint, "n": len(g), "improvement": imp[0], "improvement_low": imp[2],
                    "improvement_high": imp[3], "min_ratio": ratio[0], "min_ratio_low": ratio[2],
                    "min_ratio_high": ratio[3], "stalled": bool(stalled)})
    return pd.DataFrame(out)


def test_table(test: CBSTest, verdict: Verdict | None = None, problems: Sequence[str] | None = None) -> pd.DataFrame:
    """The test as the reports' test.csv holds it (one row: D and G with their 95% paired t intervals, the seeds,
    the threshold, the verdict and its problems); `verdict` and `problems` where a wider test (long_cbs_test)
    overrides the CBS test's own."""
    problems = test.problems if problems is None else problems
    return pd.DataFrame([{
        "statistic": f"D = log2 CBS({test.last:,.0f} tokens) - log2 CBS({test.first:,.0f})",
        "estimate": round(test.d, 3), "low": round(test.d_low, 3), "high": round(test.d_high, 3),
        "second statistic": f"G = log2 CBS({test.last:,.0f}) - log2 CBS({test.before_last:,.0f})",
        "G": round(test.g, 3), "G low": round(test.g_low, 3), "G high": round(test.g_high, 3), "seeds": test.n_seeds,
        "threshold": "D's interval above 0 and G's upper end below 1 (partly: D only)",
        "verdict": verdict or test.verdict, "problems": "; ".join(problems) or "none"}])


@dataclass(frozen=True)
class LongCBSTest(PreregisteredTest):
    """Protocol v5 (docs/protocols.md#lm-cbs-long): cbs_test on the checkpoints up to the last one at which
    the reference has not stalled."""
    test: CBSTest | None       # None when fewer than 3 checkpoints remain
    last_planned: float        # the last checkpoint of the design
    last_used: float           # the last checkpoint the test uses (NaN: none)
    stalls: pd.DataFrame       # stall_table
    verdict: Verdict
    why: str
    problems: tuple[str, ...] = ()


def long_test_table(test: LongCBSTest) -> pd.DataFrame:
    """long_cbs_test as test.csv holds it, whatever its verdict: test_table's row when D and G exist, else one row
    naming the statistic with empty estimates, the verdict and why (a not-testable stall still states its verdict
    where the gallery reads it)."""
    if test.test is not None:
        return test_table(test.test, test.verdict, test.problems).assign(last_used=test.last_used,
                                                                         last_planned=test.last_planned)
    return pd.DataFrame([{"statistic": "D = log2 CBS(last) - log2 CBS(first)", "estimate": math.nan, "low": math.nan,
                          "high": math.nan, "second statistic": "G = log2 CBS(last) - log2 CBS(the one before)",
                          "G": math.nan, "G low": math.nan, "G high": math.nan,
                          "seeds": int(test.stalls["n"].max()) if "n" in test.stalls and len(test.stalls) else 0,
                          "threshold": "D's interval above 0 and G's upper end below 1 (partly: D only)",
                          "verdict": test.verdict, "problems": test.why, "last_used": test.last_used,
                          "last_planned": test.last_planned}])


def long_cbs_test(cbs: pd.DataFrame, stalls: pd.DataFrame) -> LongCBSTest:
    """The reference at the last checkpoint must not have stalled (stall_table). If it has, the test is made on
    the checkpoints up to the latest one where it has not, provided 3 or more remain (the first, the one before
    and that one); otherwise not testable. The CBS at the first checkpoint may not be censored for half the
    seeds or more (D would be overstated). Verdicts as cbs_test's."""
    planned = float(cbs["checkpoint"].max())
    fine = stalls[~stalls["stalled"].astype(bool)]["checkpoint"]
    ordered = sorted(cbs["checkpoint"].unique())
    usable = [c for c in ordered if c <= (fine.max() if len(fine) else -math.inf)]
    # the test needs an unbroken run of checkpoints from the first to the last one used
    stalled_before = [c for c in usable if c not in set(fine)]
    if stalled_before:
        usable = [c for c in usable if c < min(stalled_before)]
    if len(usable) < 3:
        stalled = [c for c in ordered if c not in set(fine)]
        if stalled:
            why = (f"the reference stalled at {', '.join(f'{c:,.0f}' for c in stalled)} tokens (stall table); the "
                   f"test may use only the checkpoints before the first stalled one: {len(usable)} of "
                   f"{len(ordered)}, fewer than 3")
        else:
            why = f"{len(ordered)} checkpoint(s) have branch losses, fewer than the 3 the test needs"
        return LongCBSTest(None, planned, usable[-1] if usable else math.nan, stalls, Verdict.NOT_TESTABLE, why,
                           (why,))
    test = cbs_test(cbs[cbs["checkpoint"].isin(usable)])
    problems = list(test.problems)
    at_first = cbs[cbs["checkpoint"] == usable[0]]
    if at_first["censored"].sum() * 2 >= len(at_first):
        problems.append(f"the CBS at the first checkpoint ({usable[0]:g}) is censored for "
                        f"{int(at_first['censored'].sum())} of {len(at_first)} seeds")
    verdict = Verdict.NOT_TESTABLE if problems else test.verdict
    why = "; ".join(problems) if problems else (
        f"D = {test.d:+.2f} [{test.d_low:+.2f}, {test.d_high:+.2f}], G = {test.g:+.2f} [{test.g_low:+.2f}, "
        f"{test.g_high:+.2f}] (log2), last checkpoint used {usable[-1]:g} of {planned:g}")
    return LongCBSTest(test, planned, float(usable[-1]), stalls, verdict, why, tuple(problems))


# ----------------------------------------------------------------------------- protocol v6: an annealed reference
COOLDOWN_SUFFIX = "_cool"     # a v6 spec's cooldown run at a checkpoint: k = 1, decay only, over 0.2 W
EWA_SUFFIX = "_ewa"           # a v6 spec's secondary branch: constant lr, evaluated through the weight average


def v6_kinds(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """A version-6 sweep's runs by kind, from their variant names: `branches` (the wsd branches, k = 1
    included), `cooldowns` (`*_cool`), `ewa` (`*_ewa`, the secondary arm), `other` (the trunks' measurement runs)."""
    if "variant" not in runs:
        raise ConfigError("CBS v6 analysis: the runs table has no `variant` column (load the runs with the spec)")
    name = runs["variant"].astype(str)
    branch = runs["batch_schedule"] == "tokens"
    cool = name.str.endswith(COOLDOWN_SUFFIX)
    ewa = name.str.endswith(EWA_SUFFIX)
    return {"branches": runs[branch & ~cool & ~ewa], "cooldowns": runs[cool], "ewa": runs[branch & ewa],
            "other": runs[~branch & ~cool & ~ewa]}


def cooldown_losses(cooldowns: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """Per (seed, checkpoint): L_cool(T0), the annealed loss at the checkpoint (the cooldown run's `metric` at
    its end), as `loss_at_checkpoint` so that stall_per_seed reads it in place of the trajectory's own loss."""
    done = cooldowns[cooldowns["state"].eq("ok")]
    return pd.DataFrame({"seed": done["seed"].astype(int).to_numpy(),
                         "checkpoint": done["batch_at_tokens"].map(_first).to_numpy(),
                         "loss_at_checkpoint": pd.to_numeric(done[metric], errors="coerce").to_numpy()})


@dataclass(frozen=True)
class V6CBSTest(PreregisteredTest):
    """docs/protocols.md#v6-cbs: long_cbs_test on the wsd branches with the annealed reference's stall
    criterion judged per checkpoint with its interval (stall_intervals), and the EWA arm's test beside it."""
    long: LongCBSTest
    branches: pd.DataFrame        # branch_losses of the wsd branches
    stalls: pd.DataFrame          # stall_intervals
    stall_seeds: pd.DataFrame     # stall_per_seed (against L_cool)
    cbs: pd.DataFrame             # critical_batch_sizes of the wsd branches
    ewa: CBSTest | None           # the secondary arm's cbs_test (None without its runs)
    extend_last: bool             # the CBS at the last checkpoint is censored for half the seeds or more: k = 512
    verdict: Verdict
    why: str
    problems: tuple[str, ...] = ()


def v6_cbs_test(runs: pd.DataFrame, metric: str = "test_loss") -> V6CBSTest:
    """The version-6 test. Not testable, besides long_cbs_test's reasons: a branch or cooldown that has not
    ended `ok` or `diverged`; the CBS at the last checkpoint censored for half the seeds or more (then
    extend_last: the protocol adds k = 512 there, once, and judges again)."""
    kinds = v6_kinds(runs)
    branches = branch_losses(kinds["branches"], metric)
    seeds = stall_per_seed(branches, cooldown_losses(kinds["cooldowns"], metric))
    stalls = stall_intervals(seeds)
    cbs = critical_batch_sizes(branches)
    long = long_cbs_test(cbs, stalls)
    problems = list(long.problems)
    open_runs = int((~pd.concat([kinds["branches"], kinds["cooldowns"]])["state"].isin(FINISHED)).sum())
    if open_runs:
        problems.append(f"{open_runs} branch or cooldown runs have not ended ok or diverged")
    last = cbs[cbs["checkpoint"] == cbs["checkpoint"].max()]
    extend_last = bool(len(last)) and int(last["censored"].sum()) * 2 >= len(last)
    if extend_last:
        problems.append(f"the CBS at the last checkpoint ({last['checkpoint'].iloc[0]:,.0f} tokens) is censored for "
                        f"{int(last['censored'].sum())} of {len(last)} seeds: k = 512 is added there, once")
    ewa = None
    if len(kinds["ewa"]):
        ewa = cbs_test(critical_batch_sizes(branch_losses(kinds["ewa"], metric)))
    verdict = Verdict.NOT_TESTABLE if problems else long.verdict
    why = "; ".join(problems) if problems else long.why
    return V6CBSTest(long, branches, stalls, seeds, cbs, ewa, extend_last, verdict, why, tuple(problems))
