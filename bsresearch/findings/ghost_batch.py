"""Test accuracy against the ghost batch size at a fixed large batch (Hoffer, Hubara & Soudry 2017, ghost
batch normalization). No torch import.

    rows = variants.runs_per_variant(runs, spec)         # variant g16 ... g256, none; one batch size
    test = compare_ghost(rows, ghost=32)                  # ghost 32 minus whole-batch BatchNorm, Welch
    table = by_ghost_size(rows)                           # mean/std/interval per ghost size + each vs none
    slope = ghost_slope(rows)                             # test accuracy per doubling of the ghost size
    figures.accuracy_vs_ghost(ax, rows, table)

The ghost size of a run is its config's `ghost_batch_size`; a run without one (NaN) computes BatchNorm
statistics over its whole batch and is drawn at x = batch_size ("none"). Setting and pre-registered test:
docs/protocols.md#ghost-batch.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.ghost_batch (`figures` above).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import stats
from ..config import ConfigError
from .verdict import PreregisteredTest, Verdict

GHOST = "ghost_batch_size"


def ghost_sizes(rows: pd.DataFrame) -> pd.Series:
    """Each run's ghost size, with whole-batch BatchNorm (no ghost_batch_size, or one >= the batch)
    written as the batch size."""
    for column in ("batch_size", "state"):
        if column not in rows:
            raise ConfigError(f"ghost batch analysis: the runs table has no column {column!r}")
    if rows["batch_size"].nunique() != 1:
        raise ConfigError(f"ghost batch analysis needs one batch size; got {sorted(rows['batch_size'].unique())}")
    batch = rows["batch_size"].astype(float)
    ghost = pd.to_numeric(rows[GHOST], errors="coerce") if GHOST in rows else pd.Series(np.nan, index=rows.index)
    return ghost.where(ghost.notna() & (ghost < batch), batch)


@dataclass(frozen=True)
class GhostComparison(PreregisteredTest):
    """mean test accuracy at one ghost size minus that with whole-batch statistics, Welch over seeds."""
    ghost: int
    batch_size: int
    diff: float             # accuracy units (fraction)
    low: float
    high: float
    n_ghost: int
    n_none: int
    margin: float           # the gain that must not be excluded for "partly" (0.005 = half a point)
    verdict: Verdict
    problems: tuple[str, ...] = ()


def compare_ghost(rows: pd.DataFrame, ghost: int = 32, metric: str = "test_acc", margin: float = 0.005,
                  confidence: float = 0.95) -> GhostComparison:
    """The pre-registered test: Welch's interval of mean(metric at `ghost`) - mean(metric with whole-batch
    BatchNorm). Reproduced when it lies above 0; partly when it contains 0 and reaches above +margin;
    not reproduced when its upper end is at or below +margin and it is not above 0. Not testable when a
    run did not end ok (the reasons are in `problems`) or either group has fewer than 2 runs."""
    sizes = ghost_sizes(rows)
    batch = int(rows["batch_size"].iloc[0])
    if ghost >= batch:
        raise ConfigError(f"ghost must be smaller than the batch size {batch}; got {ghost}")
    problems = [f"{r.get('variant', '')} seed {r.get('seed', '?')}: run {r['state']}"
                for _, r in rows[rows["state"] != "ok"].iterrows()]
    ok = rows["state"] == "ok"
    d = stats.welch_interval(rows.loc[ok & (sizes == ghost), metric], rows.loc[ok & (sizes == batch), metric],
                             confidence)
    if problems or d.n_a < 2 or d.n_b < 2 or not math.isfinite(d.low):
        verdict = Verdict.NOT_TESTABLE
    elif d.low > 0:
        verdict = Verdict.REPRODUCED
    elif d.high > margin:
        verdict = Verdict.PARTLY
    else:
        verdict = Verdict.NOT_REPRODUCED
    return GhostComparison(ghost, batch, d.diff, d.low, d.high, d.n_a, d.n_b, margin, verdict, tuple(problems))


def with_gap(rows: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """`rows` with gap_loss = test_loss - train_loss when a metric asks for it and it is absent."""
    if "gap_loss" in metrics and "gap_loss" not in rows:
        return rows.assign(gap_loss=rows["test_loss"] - rows["train_loss"])
    return rows


def by_ghost_size(rows: pd.DataFrame, metrics: tuple[str, ...] = ("test_acc", "train_loss", "test_loss", "gap_loss"),
                  metric: str = "test_acc", confidence: float = 0.95) -> pd.DataFrame:
    """Per ghost size (runs that ended ok): n and each metric's mean, std and t interval (gap_loss = test
    minus train loss, computed when absent), then `metric` minus whole-batch BatchNorm with Welch's interval
    (`vs_none`, `vs_none_low`, `vs_none_high`; 0 width at the reference itself)."""
    data = with_gap(rows.assign(ghost=ghost_sizes(rows)), metrics)
    data = data[data["state"] == "ok"]
    table = stats.summarize(data, "ghost", list(metrics), confidence)
    batch = float(rows["batch_size"].iloc[0])
    reference = data.loc[data["ghost"] == batch, metric]
    diffs = [stats.welch_interval(data.loc[data["ghost"] == g, metric], reference, confidence) for g in table["ghost"]]
    return table.assign(vs_none=[d.diff for d in diffs], vs_none_low=[d.low for d in diffs],
                        vs_none_high=[d.high for d in diffs])


def best_ghost(table: pd.DataFrame, metric: str = "test_acc") -> pd.Series:
    """The row of by_ghost_size with the highest mean `metric` among the ghost sizes below the batch
    (chosen after the runs: its difference from whole-batch statistics is optimistic)."""
    smaller = table[table["ghost"] < table["ghost"].max()]
    return smaller.loc[smaller[f"{metric}_mean"].idxmax()]


@dataclass(frozen=True)
class GhostSlope:
    """Least-squares slope of `metric` against log2(ghost size), per seed, then a t interval over seeds."""
    slope: float            # metric units per doubling of the ghost size
    low: float
    high: float
    n_seeds: int


def ghost_slope(rows: pd.DataFrame, metric: str = "test_acc", confidence: float = 0.95) -> GhostSlope:
    """Over the ghost sizes below the batch (runs that ended ok): each seed's slope of `metric` against
    log2(ghost size), and the mean with its t interval over seeds (a seed needs 2 or more ghost sizes)."""
    data = rows.assign(ghost=ghost_sizes(rows))
    data = data[(data["state"] == "ok") & (data["ghost"] < data["batch_size"])]
    slopes = [float(np.polyfit(np.log2(g["ghost"].to_numpy(float)), g[metric].to_numpy(float), 1)[0])
              for _, g in data.groupby("seed") if g["ghost"].nunique() >= 2]
    mean, _, low, high = stats.t_interval(slopes, confidence)
    return GhostSlope(mean, low, high, len(slopes))
