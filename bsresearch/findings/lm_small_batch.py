"""Small batches for language models: Adam's beta2 at a fixed half-life, plain SGD, gradient accumulation
(Marek, Lotfi, Somasundaram, Wilson & Goldblum 2025). No torch.

    selection = select_lr(selection_runs)            # per (setting, batch): the best lr on the selection seeds
    print(seeds_overrides(selection))                # the overrides of the seeds spec (lm_small_batch_seeds.yaml)
    test = small_batch_test(confirm_runs)            # d_beta2 and d_small, paired over seeds; the verdict
    seeds = per_seed(confirm_runs)                   # every paired statistic's per-seed values (per_seed.csv)
    table = by_batch(confirm_runs)                   # final loss per (setting, batch), mean and interval
    figures.loss_vs_batch(ax, table)

A run's setting (`setting`) is read from its config: `sgd` (optimizer sgd), `adam_half_life` (beta2_scaling
half_life), `adam_fixed` (any other Adam), with `_accumulated` added where it builds its batch from
micro-batches. The loss is each run's final `test_loss`, in the runs' own units (any model). Setting and
pre-registered test: docs/protocols.md#lm-small-batch.

Analysis only (no matplotlib): the figures are bsresearch.plots.findings.lm_small_batch (`figures` above).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import stats
from ..config import ConfigError
from . import power
from .verdict import PreregisteredTest, Verdict

SETTINGS = ("adam_fixed", "adam_half_life", "sgd")
MARGIN = 0.01        # batch 1 may be this fraction worse than batch 256 and count as "no worse"
LR_STEP = 10 ** 0.5  # the grid's factor between neighbouring lrs


def settings(runs: pd.DataFrame) -> pd.Series:
    """Each run's optimizer setting (module docstring)."""
    for column in ("optimizer", "beta2_scaling"):
        if column not in runs:
            raise ConfigError(f"small-batch analysis: the runs table has no column {column!r}")
    name = np.where(runs["optimizer"] == "sgd", "sgd",
                    np.where(runs["beta2_scaling"] == "half_life", "adam_half_life", "adam_fixed"))
    accumulated = runs["micro_batch_size"].notna() & (runs["micro_batch_size"] < runs["batch_size"]) \
        if "micro_batch_size" in runs else pd.Series(False, index=runs.index)
    return pd.Series(np.where(accumulated, np.char.add(name.astype(str), "_accumulated"), name), index=runs.index)


def _final_loss(runs: pd.DataFrame, metric: str) -> pd.Series:
    """`metric` of runs that ended ok with a finite value; +inf for the others (diverged, failed...)."""
    value = pd.to_numeric(runs[metric], errors="coerce")
    return value.where(runs["state"].eq("ok") & np.isfinite(value), np.inf)


def select_lr(runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """Per (setting, batch_size): the best lr (lowest mean `metric` over the selection seeds; a run that did
    not end ok with a finite value counts as the worst), its mean, the lrs tried, whether the best is at an
    edge of them (`edge`: smallest/largest, which the protocol extends once), and the spread (max - min of the
    finite lr means: robustness to the lr)."""
    data = runs.assign(setting=settings(runs), loss=_final_loss(runs, metric))
    out = []
    for (setting, batch), g in data.groupby(["setting", "batch_size"], sort=True):
        means = g.groupby("lr")["loss"].mean().sort_index()
        best = float(means.idxmin())
        lrs = list(means.index)
        finite = means[np.isfinite(means)]
        out.append({"setting": setting, "batch_size": int(batch), "best_lr": best, "best_loss": float(means.min()),
                    "lrs": tuple(float(v) for v in lrs), "n_seeds": int(g["seed"].nunique()),
                    "edge": "smallest" if best == lrs[0] and len(lrs) > 1 else
                            "largest" if best == lrs[-1] and len(lrs) > 1 else "",
                    "spread": float(finite.max() - finite.min()) if len(finite) > 1 else math.nan})
    return pd.DataFrame(out)


def seeds_overrides(selection: pd.DataFrame) -> str:
    """The `overrides:` of the seeds spec, one per (setting, batch_size): its best lr (YAML text)."""
    lines = ["overrides:"]
    for r in selection.itertuples():
        lines.append(f"  - where: {{variant: {r.setting}, batch_size: {r.batch_size}}}")
        lines.append(f"    set: {{lr: {r.best_lr:.6g}}}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Paired:
    """mean over seeds of a - b, with its paired t interval."""
    diff: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, per_seed: pd.DataFrame) -> Paired:
        """The mean and paired t interval of a `paired_per_seed` table's diffs."""
        mean, _, low, high = stats.t_interval(per_seed["diff"].tolist())
        return cls(mean, low, high, len(per_seed))


def paired_per_seed(data: pd.DataFrame, a: tuple[str, int], b: tuple[str, int], metric: str = "loss") -> pd.DataFrame:
    """Per seed: the two cells' values (`a`, `b`) and `diff` = a - b, over the seeds both (setting, batch_size)
    cells have a finite value for: the numbers `paired`'s interval is computed from."""
    def cell(key: tuple[str, int]) -> pd.Series:
        g = data[(data["setting"] == key[0]) & (data["batch_size"] == key[1])]
        return g.groupby("seed")[metric].mean()
    both = pd.DataFrame({"a": cell(a), "b": cell(b)}).replace([np.inf, -np.inf], np.nan).dropna()   # not ok: out
    return both.assign(diff=both["a"] - both["b"]).rename_axis("seed").reset_index()


def paired(data: pd.DataFrame, a: tuple[str, int], b: tuple[str, int], metric: str = "loss") -> Paired:
    """Paired difference over the seeds both (setting, batch_size) cells have a finite value for."""
    return Paired.of(paired_per_seed(data, a, b, metric))


@dataclass(frozen=True)
class SmallBatchTest(PreregisteredTest):
    """The pre-registered test (docs/protocols.md#lm-small-batch)."""
    small: int                # the smallest and largest batch sizes compared
    large: int
    d_beta2: Paired           # L(adam_fixed, small) - L(adam_half_life, small)
    d_small: Paired           # L(adam_half_life, small) - L(adam_half_life, large)
    reference: float          # mean L(adam_half_life, large): the margin is MARGIN x this
    margin: float
    verdict: Verdict
    problems: tuple[str, ...] = ()


def small_batch_test(runs: pd.DataFrame, metric: str = "test_loss", margin: float = MARGIN) -> SmallBatchTest:
    """d_beta2 and d_small over the seeds of `runs` (each cell at its chosen lr). Reproduced when d_beta2's
    interval lies above 0 and d_small's upper end is at most margin x mean L(adam_half_life, largest batch);
    partly when exactly one holds; not reproduced when neither. Not testable when a run did not end ok or a
    comparison has fewer than 2 seeds."""
    data = runs.assign(setting=settings(runs), loss=_final_loss(runs, metric))
    small, large = int(data["batch_size"].min()), int(data["batch_size"].max())
    d_beta2 = paired(data, ("adam_fixed", small), ("adam_half_life", small))
    d_small = paired(data, ("adam_half_life", small), ("adam_half_life", large))
    ref = data[(data["setting"] == "adam_half_life") & (data["batch_size"] == large)]["loss"]
    reference = float(ref[np.isfinite(ref)].mean()) if np.isfinite(ref).any() else math.nan
    primary = data[data["setting"].isin(["adam_fixed", "adam_half_life"]) & data["batch_size"].isin([small, large])]
    problems = [f"{r.setting} batch {r.batch_size} seed {r.seed}: run {r.state}"
                for r in primary.itertuples() if r.state != "ok"]
    if d_beta2.n < 2 or d_small.n < 2:
        problems.append(f"paired seeds: {d_beta2.n} (beta2), {d_small.n} (batch)")
    beta2_holds = d_beta2.low > 0
    small_holds = d_small.high <= margin * reference
    if problems or not (math.isfinite(d_beta2.low) and math.isfinite(d_small.high)):
        verdict = Verdict.NOT_TESTABLE
    elif beta2_holds and small_holds:
        verdict = Verdict.REPRODUCED
    elif beta2_holds or small_holds:
        verdict = Verdict.PARTLY
    else:
        verdict = Verdict.NOT_REPRODUCED
    return SmallBatchTest(small, large, d_beta2, d_small, reference, margin, verdict, tuple(problems))


def by_batch(runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """Per (setting, batch_size): n, the lr, and the final `metric`'s mean, std and t interval (runs that ended
    ok), plus how many did not."""
    data = runs.assign(setting=settings(runs))
    ok = data[data["state"] == "ok"]
    table = stats.summarize(ok, ["setting", "batch_size"], [metric])
    lrs = data.groupby(["setting", "batch_size"])["lr"].agg(lambda v: ", ".join(f"{x:.3g}" for x in sorted(set(v))))
    not_ok = data[data["state"] != "ok"].groupby(["setting", "batch_size"]).size()
    return table.assign(lr=[lrs.get((s, b), "") for s, b in zip(table["setting"], table["batch_size"])],
                        not_ok=[int(not_ok.get((s, b), 0)) for s, b in zip(table["setting"], table["batch_size"])])


def comparisons(runs: pd.DataFrame, metric: str = "test_loss") -> list[tuple[str, tuple[str, int], tuple[str, int]]]:
    """Every paired comparison the report prints, primary then secondary: (name, cell a, cell b), a - b. The
    names are those of test.csv's statistics and of secondary.csv's `comparison` column."""
    data = runs.assign(setting=settings(runs))
    small, large = int(data["batch_size"].min()), int(data["batch_size"].max())
    out = [(f"d_beta2 = L(adam fixed, B={small}) - L(adam half-life, B={small})",
            ("adam_fixed", small), ("adam_half_life", small)),
           (f"d_small = L(adam half-life, B={small}) - L(adam half-life, B={large})",
            ("adam_half_life", small), ("adam_half_life", large)),
           (f"SGD - Adam (half-life), batch {small}", ("sgd", small), ("adam_half_life", small)),
           (f"SGD - Adam (half-life), batch {large}", ("sgd", large), ("adam_half_life", large))]
    accumulated = data[data["setting"] == "adam_half_life_accumulated"]
    if not accumulated.empty:
        micro, batch = int(accumulated["micro_batch_size"].iloc[0]), int(accumulated["batch_size"].iloc[0])
        out += [(f"accumulated {batch} (micro {micro}) - true batch {batch}",
                 ("adam_half_life_accumulated", batch), ("adam_half_life", batch)),
                (f"accumulated {batch} (micro {micro}) - true batch {micro}",
                 ("adam_half_life_accumulated", batch), ("adam_half_life", micro))]
    return out


def per_seed(runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """Long form, one row per (comparison, seed): both cells' final `metric`, their lrs and the difference, for
    every paired statistic of test.csv and secondary.csv (comparisons): their means and paired t intervals
    can be recomputed from this table alone."""
    data = runs.assign(setting=settings(runs), loss=_final_loss(runs, metric))
    frames = []
    for name, a, b in comparisons(runs, metric):
        rows = paired_per_seed(data, a, b)
        frames.append(rows.assign(comparison=name, setting_a=a[0], batch_a=a[1], setting_b=b[0], batch_b=b[1]))
    columns = ["comparison", "seed", "setting_a", "batch_a", "a", "setting_b", "batch_b", "b", "diff"]
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def secondary(runs: pd.DataFrame, metric: str = "test_loss") -> pd.DataFrame:
    """The secondary comparisons, paired over seeds: the SGD gap at the smallest and the largest batch and
    their difference; accumulation against the true large batch and against its micro-batch size."""
    data = runs.assign(setting=settings(runs), loss=_final_loss(runs, metric))
    small, large = int(data["batch_size"].min()), int(data["batch_size"].max())
    rows = []

    def add(name: str, p: Paired) -> None:
        rows.append({"comparison": name, "diff": p.diff, "low": p.low, "high": p.high, "n": p.n})
    gap_small = paired(data, ("sgd", small), ("adam_half_life", small))
    gap_large = paired(data, ("sgd", large), ("adam_half_life", large))
    add(f"SGD - Adam (half-life), batch {small}", gap_small)
    add(f"SGD - Adam (half-life), batch {large}", gap_large)
    by_seed = data.groupby(["setting", "batch_size", "seed"])["loss"].mean()
    try:
        gaps = [(by_seed["sgd", small, s] - by_seed["adam_half_life", small, s])
                - (by_seed["sgd", large, s] - by_seed["adam_half_life", large, s])
                for s in sorted(data["seed"].unique())
                if all(k in by_seed for k in [("sgd", small, s), ("adam_half_life", small, s),
                                              ("sgd", large, s), ("adam_half_life", large, s)])]
    except KeyError:
        gaps = []
    gaps = [g for g in gaps if math.isfinite(g)]   # a run that did not end ok: out, as in paired
    mean, _, low, high = stats.t_interval(gaps)
    add(f"SGD gap at batch {small} minus at batch {large}", Paired(mean, low, high, len(gaps)))
    accumulated = data[data["setting"] == "adam_half_life_accumulated"]
    if not accumulated.empty:
        micro = int(accumulated["micro_batch_size"].iloc[0])
        batch = int(accumulated["batch_size"].iloc[0])
        add(f"accumulated {batch} (micro {micro}) - true batch {batch}",
            paired(data, ("adam_half_life_accumulated", batch), ("adam_half_life", batch)))
        add(f"accumulated {batch} (micro {micro}) - true batch {micro}",
            paired(data, ("adam_half_life_accumulated", batch), ("adam_half_life", micro)))
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- protocol v5: beta2 at every B, SGD
def _best_lr(cell: pd.DataFrame) -> tuple[float, str]:
    """One (setting, batch_size) cell's best lr on all its seeds (lowest mean loss, a run not ok counting as the
    worst), and which edge of at least 3 lrs it lies on ("" when interior or with fewer lrs)."""
    means = cell.groupby("lr")["loss"].mean().sort_index()
    if means.empty:
        return math.nan, ""
    lrs, best = list(means.index), float(means.idxmin())
    return best, "" if len(lrs) < 3 else "smallest" if best == lrs[0] else "largest" if best == lrs[-1] else ""


def held_out(cell: pd.DataFrame) -> tuple[pd.DataFrame, tuple[float, ...]]:
    """The runs of one (setting, batch_size) cell run on an lr grid, each seed taken at the lr best on the other
    seeds (held out: no seed chooses its own lr), and those lrs in seed order. A cell of one lr is itself."""
    if cell["lr"].nunique() <= 1:
        return cell, tuple(float(v) for v in cell.sort_values("seed")["lr"])
    rows, picks = [], []
    for seed in sorted(cell["seed"].unique()):
        others = cell[cell["seed"] != seed].groupby("lr")["loss"].mean()
        if others.empty:
            continue
        picks.append(float(others.idxmin()))
        rows.append(cell[(cell["seed"] == seed) & np.isclose(cell["lr"], picks[-1])])
    return (pd.concat(rows) if rows else cell.iloc[:0]), tuple(picks)


def lr_grid_table(runs: pd.DataFrame, setting: str = "sgd", batch_size: int = 1,
                  metric: str = "test_loss") -> pd.DataFrame:
    """One (setting, batch_size) cell's lr grid, one row per lr: runs, ok, not ok, the mean, std and 95% t interval
    of the final loss over the ok runs, `best` (the lr best on all seeds, a run not ok counting as the worst, as
    sgd_test chooses it), `edge` (which edge of the grid that is, if any) and `held_out_by`, the seeds whose
    held-out choice (the lr best on the other seeds) it is. The SGD test's grid, cell by cell."""
    data = runs.assign(setting=settings(runs), loss=_final_loss(runs, metric))
    cell = data[(data["setting"] == setting) & (data["batch_size"] == batch_size)]
    best, edge = _best_lr(cell)
    _, picks = held_out(cell)
    seeds = sorted(cell["seed"].unique())
    rows = []
    for lr_value, g in cell.groupby("lr", sort=True):
        ok = g["loss"][np.isfinite(g["loss"])]
        mean, std, low, high = stats.t_interval(ok)
        rows.append({"setting": setting, "batch_size": batch_size, "lr": float(lr_value), "runs": len(g),
                     "ok": len(ok), "not_ok": len(g) - len(ok), "mean": mean, "std": std, "low": low, "high": high,
                     "best": bool(np.isclose(lr_value, best)), "edge": edge if np.isclose(lr_value, best) else "",
                     "held_out_by": ", ".join(str(s) for s, p in zip(seeds, picks) if np.isclose(p, lr_value))})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Beta2ByBatchTest(PreregisteredTest):
    """docs/protocols.md#lm-small-batch-v5: d_beta2(B) = L(adam_fixed, B) - L(adam_half_life, B) at every B."""
    per_batch: pd.DataFrame   # batch_size, diff, low, high, n, updates (optimizer steps), lr_fixed, lr_half_life
    per_seed: pd.DataFrame    # batch_size, seed, a (fixed), b (half-life), diff: the numbers each interval is from
    small: int
    verdict: Verdict
    why: str
    extend_seeds: bool
    problems: tuple[str, ...] = ()


def beta2_by_batch_test(runs: pd.DataFrame, metric: str = "test_loss", min_updates: int = 1000,
                        max_seeds: int = 8) -> Beta2ByBatchTest:
    """Paired d_beta2(B) over seeds at every batch size of the runs. Reproduced: d_beta2's interval lies above 0
    at the smallest B, and at no B does it lie below 0 (the fixed beta2 is never better). Partly: above 0 at the
    smallest B, below 0 at some other B. Not reproduced: at the smallest B the interval reaches 0. Not testable:
    a run not ok, fewer than 2 paired seeds, or a batch size with fewer than `min_updates` optimizer updates.
    A (rule, B) cell run on an lr grid (the GPU spec) takes each seed at the lr best on the other seeds
    (`held_out`); its best lr on all seeds on the grid's edge is not testable.
    extend_seeds: some batch size's interval contains 0 (each decides: the smallest B's, or one that could lie
    below 0) with fewer than max_seeds seeds (statistics item 3: once, to 8)."""
    data = runs.assign(setting=settings(runs), loss=_final_loss(runs, metric))
    data = data[data["setting"].isin(["adam_fixed", "adam_half_life"])]
    problems, cells, picks = [], [], {}
    for (setting, b), cell in data.groupby(["setting", "batch_size"], sort=True):
        best, edge = _best_lr(cell)
        if edge:
            problems.append(f"{setting} batch {b}: the best lr {best:g} is the grid's {edge}")
        cell, picks[(setting, int(b))] = held_out(cell)
        cells.append(cell)
        problems += [f"{r.setting} batch {r.batch_size} seed {r.seed}: run {r.state}" for r in cell.itertuples()
                     if r.state != "ok"]
    batches = sorted(data["batch_size"].unique())   # every batch size run: one its held-out rule empties stays
    data = pd.concat(cells) if cells else data
    rows, seeds = [], []
    for b in batches:
        seeds.append(paired_per_seed(data, ("adam_fixed", int(b)), ("adam_half_life", int(b)))
                     .assign(batch_size=int(b)))
        p = Paired.of(seeds[-1])
        steps = pd.to_numeric(data[data["batch_size"] == b].get("total_steps", pd.Series(dtype=float)), errors="coerce")
        updates = float(steps.min()) if steps.notna().any() else math.nan
        rows.append({"batch_size": int(b), "diff": p.diff, "low": p.low, "high": p.high, "n": p.n,
                     "updates": updates,
                     **{f"lr_{s.removeprefix('adam_')}": " ".join(f"{v:g}" for v in picks.get((s, int(b)), ()))
                        for s in ("adam_fixed", "adam_half_life")}})
        if p.n < 2:
            problems.append(f"batch {b}: {p.n} paired seeds")
        if math.isfinite(updates) and updates < min_updates:
            problems.append(f"batch {b}: {updates:g} optimizer updates < {min_updates}")
    per = pd.DataFrame(rows)
    per_seed = pd.concat(seeds, ignore_index=True)[["batch_size", "seed", "a", "b", "diff"]] if seeds else \
        pd.DataFrame(columns=["batch_size", "seed", "a", "b", "diff"])
    small = int(per["batch_size"].min()) if len(per) else 0
    n_seeds = int(data["seed"].nunique())
    straddle = bool(((per["low"] <= 0) & (per["high"] >= 0)).any()) if len(per) else False
    if problems or per.empty:
        return Beta2ByBatchTest(per, per_seed, small, Verdict.NOT_TESTABLE, "; ".join(problems) or "no runs", False,
                                tuple(problems))
    verdict, why = _beta2_verdict(per)
    return Beta2ByBatchTest(per, per_seed, small, verdict, why, straddle and n_seeds < max_seeds)


def _beta2_verdict(per: pd.DataFrame) -> tuple[Verdict, str]:
    """Version 5's test (1) on per-batch rows (batch_size, low, high), smallest batch first: reproduced when the
    smallest batch's d_beta2 interval lies above 0 and no batch's below 0; partly when some batch's lies below 0;
    not reproduced when the smallest batch's reaches 0."""
    per = per.sort_values("batch_size")
    first, small = per.iloc[0], int(per["batch_size"].iloc[0])
    worse = per[per["high"] < 0]["batch_size"].tolist()
    if not first["low"] > 0:
        return Verdict.NOT_REPRODUCED, f"at batch {small} d_beta2's interval reaches 0 ({first['low']:+.4f})"
    if worse:
        return Verdict.PARTLY, (f"the half-life beta2 wins at batch {small}, but the fixed beta2 is better at "
                                f"batch {', '.join(map(str, worse))}")
    return Verdict.REPRODUCED, (f"the half-life beta2 wins at batch {small}, and at no batch is the fixed beta2 "
                                f"shown better (batches {', '.join(map(str, per['batch_size']))})")


def beta2_reading(low: float, high: float) -> str:
    """What one batch size's d_beta2 interval shows (docs/protocols.md#v6-beta2)."""
    return "the fixed beta2 is better" if high < 0 else "the half-life rule is better" if low > 0 else \
        "no difference shown"


@dataclass(frozen=True)
class Beta2V6Test(PreregisteredTest):
    """docs/protocols.md#v6-beta2: d_beta2 at batch 4 and 16, each rule's lr held out per seed, then version 5's
    test (1) recomputed with these rows in place of its own at those batch sizes."""
    rows: Beta2ByBatchTest      # this version's batch sizes: per_batch, per_seed, held-out lrs, problems
    per_batch: pd.DataFrame     # every batch size of the recomputed test: batch_size, diff, low, high, n, source,
                                # reading
    verdict: Verdict            # of the recomputed test (1)
    why: str


def beta2_v6_test(runs: pd.DataFrame, earlier: pd.DataFrame, metric: str = "test_loss") -> Beta2V6Test:
    """`runs`: version 6's (batch 4 and 16 on an lr grid, every seed at the lr best on the other seeds: held_out).
    `earlier`: version 5's committed per-seed table (reports/lm_small_batch_v5/per_seed.csv, its d_beta2 rows),
    whose batch sizes that version 6 does not run (batch 1) keep their rows. Not testable as beta2_by_batch_test
    says of version 6's cells (a best lr on all seeds on the grid's edge, a chosen run not ok, fewer than 2 seeds)."""
    rows = beta2_by_batch_test(runs, metric, max_seeds=0)
    mine = set(rows.per_batch["batch_size"]) if len(rows.per_batch) else set()
    kept = earlier[earlier["statistic"].eq("d_beta2") & ~earlier["batch_size"].isin(mine)]
    before = []
    for b, g in kept.groupby("batch_size", sort=True):
        p = Paired.of(g)
        before.append({"batch_size": int(b), "diff": p.diff, "low": p.low, "high": p.high, "n": p.n,
                       "source": "version 5"})
    per = pd.concat([pd.DataFrame(before), rows.per_batch.assign(source="version 6")], ignore_index=True) \
        .sort_values("batch_size", ignore_index=True)
    per = per.assign(reading=[beta2_reading(lo, hi) for lo, hi in zip(per["low"], per["high"], strict=True)])
    if rows.verdict == Verdict.NOT_TESTABLE:
        return Beta2V6Test(rows, per, Verdict.NOT_TESTABLE, rows.why)
    verdict, why = _beta2_verdict(per)
    return Beta2V6Test(rows, per, verdict, why)


def detectable_by_batch(test: Beta2V6Test, earlier: pd.DataFrame, target: float = 0.8) -> pd.DataFrame:
    """Per batch size of version 6's rows: its seeds, version 5's per-seed sd of d_beta2 there (from `earlier`,
    its committed per-seed table), the smallest |d_beta2| those seeds detect with `target` power at that sd (the
    protocol's power statement; NaN with fewer than 2 seeds, as in a partial report), and the held-out lrs."""
    sd = power.d_beta2_by_batch(earlier)["sd"]
    rows = []
    for _, row in test.rows.per_batch.iterrows():
        b, n = int(row["batch_size"]), int(row["n"])
        known = n >= 2 and b in sd.index
        rows.append({"batch_size": b, "n": n, "sd_v5": float(sd[b]) if b in sd.index else math.nan,
                     "detectable": power.detectable_effect(n, float(sd[b]), target=target) if known else math.nan,
                     "lr_fixed": row["lr_fixed"], "lr_half_life": row["lr_half_life"]})
    return pd.DataFrame(rows, columns=["batch_size", "n", "sd_v5", "detectable", "lr_fixed", "lr_half_life"])


@dataclass(frozen=True)
class SgdTest(PreregisteredTest):
    """docs/protocols.md#lm-small-batch-v5: plain SGD at its held-out best lr against Adam (half-life) at one B."""
    batch_size: int
    best_lr: float            # on all seeds (the edge check)
    edge: str                 # "smallest" | "largest" | ""
    held_out_lrs: tuple[float, ...]
    gap: Paired               # L(sgd at the held-out lr) - L(adam_half_life), paired over seeds
    per_seed: pd.DataFrame    # seed, a (sgd), b (adam_half_life), diff: the numbers gap's interval is from
    reference: float          # mean L(adam_half_life, B)
    margin: float
    verdict: Verdict
    why: str


def sgd_test(runs: pd.DataFrame, batch_size: int = 1, metric: str = "test_loss", margin: float = MARGIN) -> SgdTest:
    """At `batch_size`: SGD's best lr (lowest mean loss, a run not ok counting as the worst) must be interior
    (else not testable: the grid is extended); each seed is then taken at the lr best on the other seeds, and
    gap = L(sgd) - L(adam_half_life) paired over seeds. Reproduced (SGD competitive) when gap's upper end is at
    most margin x mean L(adam_half_life); not reproduced otherwise."""
    data = runs.assign(setting=settings(runs), loss=_final_loss(runs, metric))
    sgd = data[(data["setting"] == "sgd") & (data["batch_size"] == batch_size)]
    adam = data[(data["setting"] == "adam_half_life") & (data["batch_size"] == batch_size)]
    lrs = sorted(sgd["lr"].unique())
    best, edge = _best_lr(sgd)
    chosen, picks = held_out(sgd)
    both = pd.concat([chosen, adam])
    per_seed = paired_per_seed(both, ("sgd", batch_size), ("adam_half_life", batch_size))
    gap = Paired.of(per_seed)
    ref = adam["loss"][np.isfinite(adam["loss"])]
    reference = float(ref.mean()) if len(ref) else math.nan
    if len(lrs) < 3 or edge:
        verdict, why = Verdict.NOT_TESTABLE, (f"SGD's best lr {best:g} is the grid's {edge or 'only choice'} "
                                              f"(extend the grid by sqrt(10) beyond it)")
    elif gap.n < 2 or not math.isfinite(gap.high):
        verdict, why = Verdict.NOT_TESTABLE, f"{gap.n} paired seeds"
    elif gap.high <= margin * reference:
        verdict, why = Verdict.REPRODUCED, f"SGD within {100 * margin:g}% of Adam at batch {batch_size}"
    else:
        verdict, why = Verdict.NOT_REPRODUCED, (f"SGD worse than Adam by {gap.diff:+.4f} [{gap.low:+.4f}, "
                                                f"{gap.high:+.4f}] at batch {batch_size}")
    return SgdTest(batch_size, best, edge, picks, gap, per_seed, reference, margin, verdict, why)
