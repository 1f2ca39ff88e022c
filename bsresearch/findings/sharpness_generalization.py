"""Sharpness against generalization (Keskar et al. 2017; Dinh et al. 2017; Jiang et al. 2020;
Andriushchenko et al. 2023): over runs that differ in batch size and learning rate, which measures rank
the runs by their generalization gap? No torch import.

    table = rank_correlations(ok, "gap_loss", MEASURES, axes=("batch_size", "lr"))
    test = finding_test(table)                      # the pre-registered verdict
    figures.correlation_plot(ax, table)
    figures.gap_scatter(ax, ok, "sharpness_worst_rho0.05", "gap_loss")

Kendall's tau between each measure and the gap, over all runs ("all") and, as Jiang et al.'s granulated
coefficient, within slices where only one axis varies ("fixed lr": the runs sharing an lr and a seed,
ranked by batch size; the mean of tau over those slices). Intervals: percentile bootstrap over seeds (a
seed keeps all its runs, which share their initial weights). The predicted sign is positive for every
sharpness measure (sharper, larger gap); distance from initialisation and B_simple carry no prediction.
Setting and pre-registered test: docs/protocols.md#sharpness-generalization.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.sharpness_generalization (`figures` above).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config import ConfigError
from .verdict import PreregisteredTest, Verdict

# The measures the toolkit records per run (metrics.json keys of the after-training registry, and the
# final history's distance from initialisation), with the sign predicted for their relation to the gap.
MEASURES: dict[str, int] = {
    "keskar_phi_eps1e-3": +1, "hessian_top_eigenvalue": +1, "hessian_trace": +1,
    "sharpness_worst_rho0.05": +1, "sharpness_average_sigma0.01": +1,
    "sharpness_adaptive_worst_rho0.5": +1, "sharpness_adaptive_average_sigma0.05": +1,
    "m_sharpness_m128_rho0.05": +1, "m_sharpness_adaptive_m128_rho0.5": +1,
    "noise_b_simple": 0, "distance_from_init": 0,
}


# The measures whose relation decides the verdict (docs/protocols.md#sharpness-generalization): worst-case
# sharpness and adaptive m-sharpness, in every scope.
DECIDING = ("sharpness_worst_rho0.05", "m_sharpness_adaptive_m128_rho0.5")
SCOPES = ("all", "varying batch_size", "varying lr")


def _tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b (ties in either variable corrected for, as scipy.stats.kendalltau) over the pairs
    where both are finite; NaN with fewer than 3 such pairs or a constant variable. Pairwise sign matrices:
    the samples here are small (tens of runs), and this runs thousands of times in a bootstrap."""
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    sx, sy = np.sign(x[:, None] - x[None, :]), np.sign(y[:, None] - y[None, :])
    # every pair counted twice in the numerator and in both factors of the denominator: the ratio is tau-b
    return float((sx * sy).sum() / math.sqrt((sx * sx).sum() * (sy * sy).sum()))


def rank_correlations(runs: pd.DataFrame, gap: str = "gap_loss", measures: Sequence[str] | None = None,
                      axes: Sequence[str] = ("batch_size", "lr"), seed_column: str = "seed", n_boot: int = 2000,
                      confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Kendall tau between each measure and `gap` over finished runs, overall and within slices.

    Scopes: "all" (every run), and "varying <axis>" for each of `axes`: tau within each group of runs that
    share every other axis and the seed (so only <axis> varies), averaged over the groups (Jiang et al.'s
    granulated coefficient). Columns: measure, scope, tau, low, high (percentile bootstrap over seeds),
    predicted (+1, or 0 for no prediction), holds ("yes" when the interval excludes 0 on the predicted side,
    "opposite" when it excludes 0 on the other, "no" when it contains 0; for no prediction, "positive",
    "negative" or "no"), n_runs. Measures missing from `runs` are left out.
    """
    measures = [m for m in (MEASURES if measures is None else measures) if m in runs]
    if not measures:
        raise ConfigError(f"rank_correlations: none of the measures is a column; known: {', '.join(MEASURES)}")
    for column in (gap, seed_column, *axes):
        if column not in runs:
            raise ConfigError(f"rank_correlations: the runs table has no column {column!r}")
    seeds = np.array(sorted(runs[seed_column].dropna().unique()))
    if len(seeds) < 2:
        raise ConfigError(f"rank_correlations needs runs of 2 or more seeds for its intervals; got {len(seeds)}")
    # Every slice lies within one seed, so a resample's slices are those of the seeds it drew (a seed drawn
    # twice gives its slices twice): slice taus are computed once per seed; only "all" is recomputed.
    g = pd.to_numeric(runs[gap], errors="coerce").to_numpy(float)
    values = {m: pd.to_numeric(runs[m], errors="coerce").to_numpy(float) for m in measures}
    seed_of = runs[seed_column].to_numpy()
    rows_of = {s: np.flatnonzero(seed_of == s) for s in seeds}
    slices: dict[tuple[str, str], dict[object, list[float]]] = {}
    for axis in axes:
        fixed = [a for a in axes if a != axis] + [seed_column]
        for m in measures:
            slices[(m, f"varying {axis}")] = {s: [] for s in seeds}
        for key, idx in runs.groupby(fixed, sort=False).indices.items():
            s = key[-1] if isinstance(key, tuple) else key
            for m in measures:
                t = _tau(values[m][idx], g[idx])
                if math.isfinite(t):
                    slices[(m, f"varying {axis}")][s].append(t)

    def scores(pick: Sequence[object]) -> dict[tuple[str, str], float]:
        idx = np.concatenate([rows_of[s] for s in pick])
        out = {}
        for m in measures:
            out[(m, "all")] = _tau(values[m][idx], g[idx])
            for axis in axes:
                taus = [t for s in pick for t in slices[(m, f"varying {axis}")][s]]
                # fsum: the same mean whatever the order the seeds were drawn in
                out[(m, f"varying {axis}")] = math.fsum(taus) / len(taus) if taus else math.nan
        return out

    point = scores(list(seeds))
    point.update({(m, "all"): _tau(values[m], g) for m in measures})   # every run, a run without a seed too
    rng = np.random.default_rng(seed)
    boots: dict[tuple[str, str], list[float]] = {k: [] for k in point}
    for _ in range(n_boot):
        for k, v in scores(list(rng.choice(seeds, size=len(seeds), replace=True))).items():
            boots[k].append(v)
    tail = (1 - confidence) / 2
    rows = []
    for (m, scope), tau in point.items():
        values = np.array([v for v in boots[(m, scope)] if math.isfinite(v)])
        low, high = np.quantile(values, [tail, 1 - tail]) if len(values) else (math.nan, math.nan)
        predicted = MEASURES.get(m, 0)
        rows.append({"measure": m, "scope": scope, "tau": tau, "low": float(low), "high": float(high),
                     "predicted": predicted, "holds": _verdict(float(low), float(high), predicted),
                     "n_runs": int(runs[m].notna().sum())})
    return pd.DataFrame(rows)


# Slice taus are fractions of small integers: a mean of them that is 0 can come out as +-1e-17. An interval
# ending within this of 0 ends at 0, and so does not exclude it.
ZERO = 1e-9


def _verdict(low: float, high: float, predicted: int) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "no"
    sign = 1 if low > ZERO else -1 if high < -ZERO else 0
    if predicted == 0:
        return {1: "positive", -1: "negative", 0: "no"}[sign]
    return "yes" if sign == predicted else "opposite" if sign == -predicted else "no"


@dataclass(frozen=True)
class FindingTest(PreregisteredTest):
    """The pre-registered verdict over a rank_correlations table (with axes batch_size and lr)."""
    verdict: Verdict
    reason: str           # which measures and scopes decided it
    deciding: pd.DataFrame  # the rows of the deciding measures, every scope


def finding_test(table: pd.DataFrame, deciding: Sequence[str] = DECIDING,
                 scopes: Sequence[str] = SCOPES) -> FindingTest:
    """Reproduced when every `deciding` measure holds ("yes") in every scope; partly when some sharpness
    measure (predicted +1) holds in some scope (the protocol names "the 'all' scope only"; a measure that
    holds within slices but not overall, which its table does not name, is counted here as well); not
    reproduced when no sharpness measure holds in any scope; not testable when a deciding measure or scope
    is missing from the table (not measured) or its tau is undefined (NaN)."""
    rows = table[table["measure"].isin(deciding) & table["scope"].isin(scopes)]
    have = set(zip(rows["measure"], rows["scope"]))
    missing = [f"{m} ({s})" for m in deciding for s in scopes if (m, s) not in have]
    undefined = [f"{r.measure} ({r.scope})" for r in rows.itertuples() if not math.isfinite(r.tau)]
    if missing or undefined:
        what = f"not in the table: {', '.join(missing)}" if missing else f"tau undefined: {', '.join(undefined)}"
        return FindingTest(Verdict.NOT_TESTABLE, what, rows)
    if (rows["holds"] == "yes").all():
        return FindingTest(Verdict.REPRODUCED, f"{' and '.join(deciding)} hold in every scope", rows)
    held = table[(table["predicted"] > 0) & (table["holds"] == "yes")]
    if len(held):
        return FindingTest(Verdict.PARTLY, "holds: " + ", ".join(f"{r.measure} ({r.scope})" for r in held.itertuples()),
                           rows)
    return FindingTest(Verdict.NOT_REPRODUCED, "no sharpness measure holds in any scope", rows)
