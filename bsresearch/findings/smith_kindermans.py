"""Smith, Kindermans, Ying & Le (2018), "Don't Decay the Learning Rate, Increase the Batch Size": growing
the batch by a factor at the milestones where a step schedule would divide the lr by that factor reaches
the same test accuracy with fewer parameter updates. No torch import.

    verdict = compare_schedules(rows, "test_acc", margin=0.01)   # rows: sweep.runs_per_variant
    figures.curves_by_schedule(ax, history, x="epoch")

Runs of the two variants (`decay`: schedule step; `ramp`: batch_schedule step, constant lr) share the
milestones, the epoch budget and the seeds. Setting and pre-registered test:
docs/protocols.md#smith-kindermans.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.smith_kindermans (`figures` above).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..config import ConfigError
from ..stats import welch_interval
from .verdict import PreregisteredTest, Verdict


@dataclass(frozen=True)
class ScheduleComparison(PreregisteredTest):
    """ramp minus decay: the mean final metric over seeds with Welch's interval, and the updates used."""
    diff: float             # mean(ramp) - mean(decay), in the metric's units
    low: float
    high: float
    n_ramp: int
    n_decay: int
    steps_ramp: float       # mean parameter updates of a ramp run
    steps_decay: float
    margin: float           # equivalence margin, the metric's units
    verdict: Verdict        # may be INCONCLUSIVE: the interval straddles -margin (the protocol adds seeds)

    @property
    def steps_ratio(self) -> float:
        return self.steps_ramp / self.steps_decay


def compare_schedules(rows: pd.DataFrame, metric: str = "test_acc", margin: float = 0.01, variant: str = "variant",
                      ramp: str = "ramp", decay: str = "decay") -> ScheduleComparison:
    """The pre-registered comparison of Welch's 95% interval of mean(ramp) - mean(decay), with ramp runs
    using fewer updates: reproduced when the interval lies inside [-margin, +margin]; partly when it lies
    above -margin but reaches past +margin (no worse, maybe better); not reproduced when it lies below
    -margin, or when ramp runs do not use fewer updates; inconclusive when it straddles -margin (the
    protocol then adds seeds up to 8); not testable with fewer than 2 finished runs of either. Only runs
    with state ok count."""
    for column in (variant, metric, "steps", "state"):
        if column not in rows:
            raise ConfigError(f"compare_schedules: the runs table has no column {column!r}")
    ok = rows[rows["state"] == "ok"]
    a, b = ok[ok[variant] == ramp], ok[ok[variant] == decay]
    d = welch_interval(a[metric], b[metric])
    steps_a = float(a["steps"].mean()) if len(a) else math.nan
    steps_b = float(b["steps"].mean()) if len(b) else math.nan
    if d.n_a < 2 or d.n_b < 2 or not math.isfinite(d.low):
        verdict = Verdict.NOT_TESTABLE
    elif not steps_a < steps_b:
        verdict = Verdict.NOT_REPRODUCED
    elif -margin <= d.low and d.high <= margin:
        verdict = Verdict.REPRODUCED
    elif d.low > -margin:
        verdict = Verdict.PARTLY
    elif d.high < -margin:
        verdict = Verdict.NOT_REPRODUCED
    else:
        verdict = Verdict.INCONCLUSIVE
    return ScheduleComparison(d.diff, d.low, d.high, d.n_a, d.n_b, steps_a, steps_b, margin, verdict)
