"""Batch-size warmup: start small, grow the batch as the critical batch size allows (Merrill, Arora,
Groeneveld & Hajishirzi 2025). No torch.

    at, sizes, large = warmup_schedule(cbs_table, b0=4)   # the pre-registered rule, from lm_cbs's result
    test = warmup_test(runs)                               # warmup against small and large, paired over seeds
    seeds = per_seed(runs)                                 # the per-seed losses and differences it is made of
    curves = loss_curves(history)                          # loss against tokens and steps, per schedule
    figures.loss_vs(ax, curves, "tokens")

A run's schedule is read from its config: `warmup` (batch_schedule tokens), `small` (a constant batch, the
smallest of the sweep) and `large` (a constant batch larger than that). The loss is each run's final
`test_loss` in the runs' own units (any model). Setting and pre-registered test:
docs/protocols.md#lm-batch-warmup.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.lm_batch_warmup (`figures` above).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import stats
from ..config import ConfigError
from .verdict import PreregisteredTest, Verdict

MARGIN = 0.01   # warmup may be this fraction worse than the small batch and count as "no worse"


def warmup_schedule(cbs_table: pd.DataFrame, b0: int) -> tuple[list[float], list[int], int]:
    """The rule fixed before lm_cbs ran: at each checkpoint the batch becomes the geometric mean over seeds of
    the CBS measured there (`cbs_gmean` of findings.lm_cbs.cbs_by_checkpoint), rounded down to a power of 2,
    never below the batch before it, at most the value at the last checkpoint (the large batch B_L).
    Returns (batch_at_tokens, batch_sizes, B_L) for a `batch_schedule: tokens` config starting at b0; a
    checkpoint where the batch would not change adds no change."""
    rows = cbs_table.sort_values("checkpoint")
    if rows.empty:
        raise ConfigError("warmup_schedule needs the CBS at one checkpoint or more")
    rounded = [max(1, 2 ** math.floor(math.log2(v))) for v in rows["cbs_gmean"]]
    large = max(b0, rounded[-1])
    at, sizes, current = [], [], b0
    for checkpoint, size in zip(rows["checkpoint"], rounded):
        size = min(max(size, current), large)
        if size != current:
            at.append(float(checkpoint))
            sizes.append(int(size))
            current = size
    return at, sizes, int(large)


def schedules(runs: pd.DataFrame) -> pd.Series:
    """Each run's schedule: warmup, small or large (module docstring)."""
    for column in ("batch_schedule", "batch_size"):
        if column not in runs:
            raise ConfigError(f"batch warmup analysis: the runs table has no column {column!r}")
    constant = runs["batch_schedule"] == "constant"
    smallest = runs.loc[constant, "batch_size"].min()
    return pd.Series(np.where(~constant, "warmup", np.where(runs["batch_size"] == smallest, "small", "large")),
                     index=runs.index)


@dataclass(frozen=True)
class WarmupTest(PreregisteredTest):
    """The pre-registered test (docs/protocols.md#lm-batch-warmup)."""
    d_small: float            # mean over seeds of L(warmup) - L(small)
    d_small_low: float
    d_small_high: float
    d_large: float            # mean over seeds of L(warmup) - L(large)
    d_large_low: float
    d_large_high: float
    small_loss: float         # mean L(small): the margin is MARGIN x this
    steps_fraction: float     # mean steps of warmup / mean steps of small
    n_seeds: int
    verdict: Verdict
    problems: tuple[str, ...] = ()


def _paired_diffs(data: pd.DataFrame, a: str, b: str) -> pd.Series:
    """Per seed, L(a) - L(b), over the seeds where both ended ok (a run that did not: out)."""
    by = data.pivot_table(index="seed", columns="schedule", values="loss", aggfunc="mean")
    if a not in by or b not in by:
        return pd.Series(dtype=float)
    return (by[a] - by[b]).replace([np.inf, -np.inf], np.nan).dropna()


def _paired(data: pd.DataFrame, a: str, b: str) -> tuple[float, float, float, int]:
    diffs = _paired_diffs(data, a, b)
    mean, _, low, high = stats.t_interval(diffs.tolist())
    return mean, low, high, len(diffs)


def _with_schedules(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The runs with their schedule and `loss`: the final `metric`, inf for a run that did not end ok."""
    value = pd.to_numeric(runs[metric], errors="coerce")
    return runs.assign(schedule=schedules(runs), loss=value.where(runs["state"].eq("ok") & np.isfinite(value), np.inf))


def per_seed(runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """One row per seed: each schedule's final `metric` and steps, and the test's paired differences d_small =
    L(warmup) - L(small) and d_large = L(warmup) - L(large) (NaN where a run of the pair did not end ok): the
    numbers warmup_test's means and paired t intervals are computed from."""
    data = _with_schedules(runs, metric)
    loss = data.pivot_table(index="seed", columns="schedule", values="loss", aggfunc="mean")
    table = pd.DataFrame(index=loss.index.rename("seed"))
    for schedule in ("small", "warmup", "large"):
        if schedule in loss:
            table[f"loss_{schedule}"] = loss[schedule].replace([np.inf, -np.inf], np.nan)
    if "steps" in data:
        steps = data.pivot_table(index="seed", columns="schedule", values="steps", aggfunc="mean")
        for schedule in ("small", "warmup", "large"):
            if schedule in steps:
                table[f"steps_{schedule}"] = steps[schedule]
    table["d_small"] = _paired_diffs(data, "warmup", "small")
    table["d_large"] = _paired_diffs(data, "warmup", "large")
    return table.reset_index()


def warmup_test(runs: pd.DataFrame, metric: str = "test_loss", margin: float = MARGIN) -> WarmupTest:
    """Reproduced when L(warmup) - L(small)'s upper end is at most margin x mean L(small) and L(warmup) -
    L(large)'s interval lies below 0, with fewer steps than small; partly when exactly one of the two loss
    conditions holds (with fewer steps); not reproduced otherwise. Not testable when a run did not end ok or
    fewer than 2 seeds pair up."""
    data = _with_schedules(runs, metric)
    d_small, s_low, s_high, n_small = _paired(data, "warmup", "small")
    d_large, l_low, l_high, n_large = _paired(data, "warmup", "large")
    small_loss = float(data.loc[(data["schedule"] == "small") & np.isfinite(data["loss"]), "loss"].mean())
    steps = data.groupby("schedule")["steps"].mean() if "steps" in data else pd.Series(dtype=float)
    fraction = float(steps.get("warmup", math.nan) / steps.get("small", math.nan)) if len(steps) else math.nan
    problems = [f"{r.schedule} seed {r.seed}: run {r.state}" for r in data.itertuples() if r.state != "ok"]
    if min(n_small, n_large) < 2:
        problems.append(f"paired seeds: {n_small} (small), {n_large} (large)")
    no_worse = s_high <= margin * small_loss
    better = l_high < 0
    fewer = fraction < 1
    if problems or not (math.isfinite(s_high) and math.isfinite(l_high)):
        verdict = Verdict.NOT_TESTABLE
    elif no_worse and better and fewer:
        verdict = Verdict.REPRODUCED
    elif (no_worse or better) and fewer:
        verdict = Verdict.PARTLY
    else:
        verdict = Verdict.NOT_REPRODUCED
    return WarmupTest(d_small, s_low, s_high, d_large, l_low, l_high, small_loss, fraction, min(n_small, n_large),
                      verdict, tuple(problems))


def loss_curves(history: pd.DataFrame, runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """history (results.load_history) with each run's schedule, and tokens trained (examples x tokens per
    example when the history has no `tokens`)."""
    schedule = schedules(runs).set_axis(runs["run_id"])
    out = history.assign(schedule=history["run_id"].map(schedule))
    if "tokens" not in out:
        out = out.assign(tokens=out["examples"])
    return out[["run_id", "seed", "schedule", "step", "tokens", metric]].dropna(subset=[metric])


def steps_to_reach(curves: pd.DataFrame, target: float, metric: str = "test_loss") -> pd.DataFrame:
    """Per run: the first step at which `metric` is at most `target`, interpolated linearly between the
    evaluations around it (NaN if never)."""
    rows = []
    for run_id, g in curves.groupby("run_id", sort=False):
        g = g.sort_values("step")
        below = np.flatnonzero(g[metric].to_numpy() <= target)
        step = math.nan
        if len(below):
            i = below[0]
            if i == 0:
                step = float(g["step"].iloc[0])
            else:
                (s0, s1), (l0, l1) = g["step"].iloc[i - 1:i + 1], g[metric].iloc[i - 1:i + 1]
                step = float(s0 + (s1 - s0) * (l0 - target) / (l0 - l1)) if l0 != l1 else float(s1)
        rows.append({"run_id": run_id, "seed": g["seed"].iloc[0], "schedule": g["schedule"].iloc[0], "step": step})
    return pd.DataFrame(rows)
