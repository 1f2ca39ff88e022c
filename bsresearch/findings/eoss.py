"""The edge of stochastic stability (Andreyev and Beneventano 2024; Cohen et al. 2021, 2022), protocol version 6
(docs/protocols.md#v6-eoss): how the batch size sets the curvature that SGD at a fixed lr settles at.

Runs (`stability: true`) write along training, per evaluation: `sharpness` (the full-train loss's top Hessian
eigenvalue), `batch_sharpness` (the mean over mini-batches of g_B' H_B g_B / |g_B|^2), `noise_along_top` and, with
Adam, `preconditioned_sharpness` (measure/stability.py). A run's *settled* value of a column is the mean over the
last SETTLED_FRACTION of its measurement steps (the rows where it was measured).

    eta_rule     the lr: the largest eta of the rule's grid at which B = RULE_BATCH trains on every seed
    eoss_test    P1-P3 on the SGD arm at that eta, P4 on the Adam arm; the verdict from P1-P3
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..config import ConfigError
from ..stats import t_interval
from .verdict import PreregisteredTest, Verdict

SETTLED_FRACTION = 0.3       # "settled": the mean over the last 30% of the measurement steps (floor, at least 1)
TRAINS_RATIO = 0.5           # the lr rule: a run trains when its final train loss is below half its step-0 loss
RULE_BATCH = 1024
RULE_ETAS = (0.01, 0.02, 0.05, 0.1)
BAND = (0.8, 1.2)            # P1, P4: the settled value's interval inside this band times the limit
P2_MAX_BATCH = 256           # P2: lambda_max below 2/eta at every counted B up to this
ADAM_BETA1 = 0.9
MIN_BATCHES = 5              # not testable with fewer counted batch sizes
STABILITY_COLUMNS = ("sharpness", "batch_sharpness", "batch_sharpness_pooled", "noise_along_top",
                     "preconditioned_sharpness")
BATCH_COLUMNS = {"batch_sharpness": "batch sharpness",                          # P1's: the mean of ratios (6.1)
                 "batch_sharpness_pooled": "batch sharpness (ratio of means)"}  # the paper's (6.6)


def settled(history: pd.DataFrame, columns: Sequence[str] = STABILITY_COLUMNS,
            fraction: float = SETTLED_FRACTION) -> pd.DataFrame:
    """One row per run (run_id) of a long-form history (results.load_history): each column's mean over the last
    floor(fraction x n) of the n rows where `sharpness` was measured (at least 1), and `measured` = n."""
    rows = []
    for run_id, g in history.groupby("run_id", sort=False):
        measured = g[g["sharpness"].notna()].sort_values("step") if "sharpness" in g else g.iloc[:0]
        n = len(measured)
        last = measured.tail(max(1, int(fraction * n))) if n else measured
        row = {"run_id": run_id, "measured": n, "from_step": int(last["step"].min()) if n else -1}
        for c in columns:
            row[c] = float(pd.to_numeric(last[c], errors="coerce").mean()) if n and c in last else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["run_id", "measured", "from_step", *columns])


@dataclass(frozen=True)
class EtaRule:
    """The lr rule: per eta, whether B = batch trains on every seed (`table`), and the largest that does."""
    eta: float                   # NaN when none trains
    table: pd.DataFrame          # eta, seeds, ok, trained, trains
    why: str


def eta_rule(runs: pd.DataFrame, history: pd.DataFrame, batch: int = RULE_BATCH,
             etas: Sequence[float] = RULE_ETAS, ratio: float = TRAINS_RATIO) -> EtaRule:
    """The largest eta of `etas` at which every SGD run at `batch` ends `ok` with its final train loss below
    `ratio` times its step-0 train loss (an eta with no runs does not train)."""
    sgd = runs[(runs["optimizer"] == "sgd") & (runs["batch_size"] == batch)]
    start = history[history["step"] == 0].groupby("run_id")["train_loss"].first()
    rows = []
    for eta in sorted(etas):
        g = sgd[np.isclose(sgd["lr"].astype(float), eta)]
        ok = g["state"].eq("ok")
        first = g["run_id"].map(start).astype(float)   # an eta with no runs: an empty float column, not strings
        trained = ok & (pd.to_numeric(g["train_loss"], errors="coerce") < ratio * first)
        rows.append({"eta": eta, "seeds": len(g), "ok": int(ok.sum()), "trained": int(trained.sum()),
                     "trains": bool(len(g)) and bool(trained.all())})
    table = pd.DataFrame(rows)
    passing = table[table["trains"]]
    if passing.empty:
        return EtaRule(math.nan, table, f"no eta of {list(etas)} trains at B = {batch} on every seed")
    eta = float(passing["eta"].max())
    return EtaRule(eta, table, f"eta = {eta:g}: the largest of {list(etas)} at which B = {batch} ends ok with its "
                               f"train loss below {ratio:g} x its start on all {int(passing.iloc[-1]['seeds'])} seeds")


@dataclass(frozen=True)
class Prediction:
    name: str
    holds: bool | None           # None: not computable
    statistic: str
    estimate: float
    low: float
    high: float
    criterion: str


@dataclass(frozen=True)
class EossTest(PreregisteredTest):
    """docs/protocols.md#v6-eoss on one data set: P1-P3 (the verdict) and P4 (reported beside it)."""
    eta: float
    per_seed: pd.DataFrame       # one row per run: arm, batch_size, seed, state, settled columns
    per_batch: pd.DataFrame      # arm, batch_size, seeds, counted, and each settled column's mean and t interval
    predictions: tuple[Prediction, ...]
    left_out: tuple[str, ...]    # the batch sizes left out of the SGD arm, and why
    verdict: Verdict
    why: str
    problems: tuple[str, ...] = ()


def _interval(values: pd.Series) -> tuple[float, float, float]:
    mean, _, low, high = t_interval(values)
    return mean, low, high


def _at_row(name: str, holds: bool | None, statistic: str, row: pd.Series | None, column: str,
            criterion: str) -> Prediction:
    """A prediction read at one batch size's row of the per-batch table (its mean and interval of `column`)."""
    if row is None:
        return Prediction(name, holds, statistic, math.nan, math.nan, math.nan, criterion)
    return Prediction(name, holds, statistic, float(row[column]), float(row[f"{column}_low"]),
                      float(row[f"{column}_high"]), criterion)


def _per_batch(per_seed: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (arm, batch), g in per_seed.groupby(["arm", "batch_size"], sort=True):
        row: dict[str, object] = {"arm": arm, "batch_size": int(batch), "seeds": len(g),
                                  "ok": int(g["state"].eq("ok").sum()), "counted": bool(g["state"].eq("ok").all())}
        for c in (*STABILITY_COLUMNS, "limit_ratio", "batch_limit_ratio", "precond_limit_ratio"):
            row[c], row[f"{c}_low"], row[f"{c}_high"] = _interval(g[c])
        rows.append(row)
    return pd.DataFrame(rows)


def _slopes(sgd: pd.DataFrame) -> pd.Series:
    """Per seed, the least-squares slope of log2(lambda_max / limit) on log2 B over the counted batch sizes."""
    out = {}
    for seed, g in sgd.groupby("seed"):
        g = g[(g["limit_ratio"] > 0)]
        if g["batch_size"].nunique() >= 2:
            out[seed] = float(np.polyfit(np.log2(g["batch_size"].astype(float)), np.log2(g["limit_ratio"]), 1)[0])
    return pd.Series(out, dtype=float)


def eoss_test(runs: pd.DataFrame, history: pd.DataFrame, eta: float, adam_lr: float | None = None,
              band: tuple[float, float] = BAND, p2_max_batch: int = P2_MAX_BATCH,
              min_batches: int = MIN_BATCHES, batch_column: str = "batch_sharpness") -> EossTest:
    """The pre-registered test on the SGD runs at lr `eta` and the Adam runs (at `adam_lr`, or any) of `runs`,
    their histories in `history` (results.load_history with run_id). A batch size of the SGD arm counts when
    all its seeds end `ok`; one that does not is left out and named. Reproduced: P1, P2 and P3 hold; partly:
    some; not reproduced: none. Not testable: no eta, fewer than `min_batches` counted batch sizes. P1 reads
    `batch_column` (BATCH_COLUMNS: the mean of the mini-batches' ratios, or their ratio of means)."""
    if batch_column not in BATCH_COLUMNS:
        raise ConfigError(f"batch_column must be one of {', '.join(BATCH_COLUMNS)}; got {batch_column!r}")
    rows = runs[["run_id", "optimizer", "lr", "batch_size", "seed", "state"]].join(
        settled(history).set_index("run_id"), on="run_id")
    lr = rows["lr"].astype(float)
    is_adam = rows["optimizer"].isin(["adam", "adamw"]) & (np.isclose(lr, adam_lr) if adam_lr is not None else True)
    rows["arm"] = np.select([(rows["optimizer"] == "sgd") & np.isclose(lr, eta), is_adam], ["sgd", "adam"], "")
    rows = rows[rows["arm"] != ""].copy()                                   # a NaN eta matches no SGD run
    lr = rows["lr"].astype(float)
    rows["limit_ratio"] = rows["sharpness"] * lr / 2                       # lambda_max / (2 / eta)
    rows["batch_limit_ratio"] = rows[batch_column] * lr / 2
    rows["precond_limit_ratio"] = rows["preconditioned_sharpness"] * (1 - ADAM_BETA1) * lr / (2 + 2 * ADAM_BETA1)
    per_seed = rows.sort_values(["arm", "batch_size", "seed"]).reset_index(drop=True)
    per_batch = _per_batch(per_seed)
    sgd_batches = per_batch[per_batch["arm"] == "sgd"] if len(per_batch) else per_batch
    left_out = tuple(f"B = {int(r.batch_size)}: {r.seeds - r.ok} of {r.seeds} seeds not ok"
                     for r in sgd_batches.itertuples() if not r.counted)
    counted = sgd_batches[sgd_batches["counted"]] if len(sgd_batches) else sgd_batches
    problems = []
    if math.isnan(eta):
        problems.append("the lr rule picked no eta")
    if len(counted) < min_batches:
        problems.append(f"{len(counted)} batch sizes count (needs {min_batches})" +
                        (f"; left out: {'; '.join(left_out)}" if left_out else ""))
    elif counted["batch_limit_ratio"].isna().all():
        problems.append(f"P1's {batch_column} was not recorded by these runs")
    predictions = [_adam_prediction(per_batch, band)]
    if problems:
        return EossTest(eta, per_seed, per_batch, tuple(predictions), left_out, Verdict.NOT_TESTABLE,
                        "; ".join(problems), tuple(problems))
    lo, hi = band
    p1_holds = bool(((counted["batch_limit_ratio_low"] >= lo) & (counted["batch_limit_ratio_high"] <= hi)).all())
    p1_pred = _at_row("P1", p1_holds, f"{BATCH_COLUMNS[batch_column]} / (2/eta), the B farthest from 1",
                      counted.loc[(counted["batch_limit_ratio"] - 1).abs().idxmax()], "batch_limit_ratio",
                      f"interval inside [{lo:g}, {hi:g}] at every B")
    small = counted[counted["batch_size"] <= p2_max_batch]
    p2_pred = _at_row("P2", bool((small["limit_ratio_high"] < 1).all()) if len(small) else None,
                      f"lambda_max / (2/eta), the highest upper end at B <= {p2_max_batch}",
                      small.loc[small["limit_ratio_high"].idxmax()] if len(small) else None, "limit_ratio",
                      f"upper end below 1 at every B <= {p2_max_batch}")
    in_counted = per_seed[(per_seed["arm"] == "sgd") & per_seed["batch_size"].isin(counted["batch_size"])]
    s_mean, s_low, s_high = _interval(_slopes(in_counted))
    p3_pred = Prediction("P3", bool(s_low > 0) if not math.isnan(s_low) else None,
                         "slope of log2(lambda_max eta / 2) on log2 B, per seed", s_mean, s_low, s_high,
                         "interval above 0")
    core = [p1_pred, p2_pred, p3_pred]
    held = [p.name for p in core if p.holds]
    if len(held) == 3:
        verdict = Verdict.REPRODUCED
    elif held:
        verdict = Verdict.PARTLY
    else:
        verdict = Verdict.NOT_REPRODUCED
    shown = "; ".join(f"{p.name} {'holds' if p.holds else 'fails'}: {p.estimate:.3f} [{p.low:.3f}, {p.high:.3f}]"
                      for p in core)
    why = f"eta {eta:g}, {len(counted)} batch sizes: {shown}" + (f"; left out: {'; '.join(left_out)}"
                                                                  if left_out else "")
    return EossTest(eta, per_seed, per_batch, tuple(core + predictions), left_out, verdict, why)


def _adam_prediction(per_batch: pd.DataFrame, band: tuple[float, float]) -> Prediction:
    """P4 (beside the verdict): Adam's preconditioned sharpness over its limit 38/lr, inside the band at the
    largest B and with its upper end below 1 at the smallest."""
    adam = per_batch[(per_batch["arm"] == "adam") & per_batch["counted"]] if len(per_batch) else per_batch
    lo, hi = band
    criterion = f"inside [{lo:g}, {hi:g}] at the largest B, upper end below 1 at the smallest"
    if len(adam) < 2:
        return _at_row("P4", None, "Adam: preconditioned sharpness / (38/lr) (needs two batch sizes)", None,
                       "precond_limit_ratio", criterion)
    large, small = adam.loc[adam["batch_size"].idxmax()], adam.loc[adam["batch_size"].idxmin()]
    holds = (large["precond_limit_ratio_low"] >= lo and large["precond_limit_ratio_high"] <= hi
             and small["precond_limit_ratio_high"] < 1)
    return _at_row("P4", bool(holds),
                   f"Adam: preconditioned sharpness / (38/lr) at B = {int(large['batch_size'])} "
                   f"(at B = {int(small['batch_size'])}: {small['precond_limit_ratio']:.3f} "
                   f"[{small['precond_limit_ratio_low']:.3f}, {small['precond_limit_ratio_high']:.3f}])",
                   large, "precond_limit_ratio", criterion)


def test_table(test: EossTest) -> pd.DataFrame:
    """One row per prediction, the verdict (of P1-P3) on each (test.csv's form: the gallery reads `verdict`)."""
    return pd.DataFrame([{"prediction": p.name, "statistic": p.statistic, "estimate": p.estimate, "low": p.low,
                          "high": p.high, "criterion": p.criterion,
                          "holds": "n/a" if p.holds is None else ("yes" if p.holds else "no"),
                          "in_verdict": p.name != "P4", "eta": test.eta, "verdict": str(test.verdict),
                          "why": test.why} for p in test.predictions])
