"""Figures of the B/N-or-steps tests (protocol versions 5 and 6): the break against N per arm, beside what B/N
and B_crit predict; the gap against N per arm."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from ...findings.bn_budget import (
    BCRIT_MIN_BATCHES,
    BCRIT_MIN_REACHED,
    MARGIN,
    TARGET_BATCH,
    TARGET_EPOCHS,
    BreakPredictorTest,
    PredictorC,
    PredictorTest,
    in_fit,
)
from .. import save_figure

ARM_MARKERS = {"epochs": "o", "steps": "s", "examples": "^"}


def break_vs_n(ax: Axes, test: PredictorTest | BreakPredictorTest, bcrit: pd.DataFrame | None = None,
               anchor_arms: tuple[str, ...] = ("steps", "epochs")) -> None:
    """b(N, arm) for each arm of the test's table (a break beyond the grid drawn at 2x the largest batch, open
    marker), the B/N line through the smallest N's break of the first of `anchor_arms` that breaks somewhere and
    the B/B_crit line through it: B_crit(N) scaled to it when `bcrit` is given (version 5), else the slope of the
    c the test used (version 6: c octaves from the smallest to the largest N, whichever B_crit it came from). The
    deciding statistic is the slope (version 5: the steps arm; version 6: the examples arm). The label says which
    arm the lines go through, so the predictions are drawn whenever some arm breaks."""
    table = test.table
    present = set(table["arm"])
    for arm, marker in ARM_MARKERS.items():
        if arm not in present:
            continue
        mine = table[table["arm"] == arm].sort_values("n")
        top = 2 * mine["largest"].max() if len(mine) else np.nan
        beyond = ~np.isfinite(mine["b_break"])
        line, = ax.plot(mine["n"], mine["b_break"].where(~beyond, top), label=f"break, {arm} arm")
        ax.plot(mine["n"][~beyond], mine["b_break"][~beyond], marker, color=line.get_color())
        if beyond.any():
            ax.plot(mine["n"][beyond], [top] * int(beyond.sum()), marker, color=line.get_color(), mfc="none",
                    label=f"{arm} arm: no break up to {mine['largest'].max():g} (drawn at 2x)")
    anchor = next(((arm, broke) for arm in anchor_arms
                   if len(broke := table[(table["arm"] == arm) & np.isfinite(table["b_break"])].sort_values("n"))),
                  None)
    if anchor is not None:
        arm, broke = anchor
        n0, b0 = broke["n"].iloc[0], broke["b_break"].iloc[0]
        through = f", through the {arm} arm's break at N = {n0:g}"
        ns = np.array(sorted(table["n"].unique()), dtype=float)
        ax.plot(ns, b0 * ns / n0, "k--", lw=1, label=f"B/N fixed{through}")
        if bcrit is not None and len(bcrit):
            ref = float(bcrit.sort_values("n")["b_crit"].iloc[0])
            ax.plot(bcrit["n"], b0 * bcrit["b_crit"] / ref, "k:", lw=1, label=f"B/B_crit fixed{through}")
        elif isinstance(test, BreakPredictorTest) and np.isfinite(test.c[0]) and len(ns) > 1:
            per_octave = test.c[0] / np.log2(ns[-1] / ns[0])
            ax.plot(ns, b0 * (ns / n0) ** per_octave, "k:", lw=1,
                    label=f"B/B_crit fixed (c = {test.c[0]:+.2f} octaves){through}")
    ax.set(xscale="log", yscale="log", xlabel="N (training examples)", ylabel="smallest batch that fails",
           title=f"break: {test.predictor} ({test.verdict})")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16))   # below: the breaks fill the panel


def gap_vs_n(ax: Axes, test: PredictorTest) -> None:
    """gap_epochs and gap_steps (points) against N with their Welch intervals, and the -1 point margin."""
    table = test.table.sort_values("n")
    for arm, marker in (("epochs", "o"), ("steps", "s")):
        y = 100 * table[f"gap_{arm}"]
        err = [y - 100 * table[f"gap_{arm}_low"], 100 * table[f"gap_{arm}_high"] - y]
        ax.errorbar(table["n"], y, yerr=err, marker=marker, capsize=3, label=f"LB - SB, {arm} arm")
    ax.axhline(-1, color="k", ls="--", lw=1)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(xscale="log", xlabel="N (training examples)", ylabel="test accuracy gap (points)",
           title=f"gap: {test.predictor} ({test.verdict})")
    ax.legend(fontsize=7)


def bcrit_steps(ax: Axes, steps: pd.DataFrame, table: pd.DataFrame, min_reached: int = BCRIT_MIN_REACHED) -> str:
    """The own-setting B_crit (protocol v6): every seed's steps to the target against B per N (filled: the batch
    sizes in the fit, where at least `min_reached` seeds reached the target; open: the others), the median per B,
    and McCandlish's fit S_min (1 + B_crit / B) over the fitted batch sizes (own_setting_bcrit's table), its label
    saying whether the protocol's rule counts it as measured. Returns the figure's caption."""
    reached = steps.assign(_fit=in_fit(steps, min_reached)).dropna(subset=["steps"])
    for row in table.sort_values("n").itertuples():
        mine = reached[reached["n"] == row.n]
        fitted = mine["_fit"]
        median = mine[fitted].groupby("batch_size")["steps"].median()
        state = "valid" if row.valid else (f"not valid: {row.n_batches} batch sizes"
                                           + (", a best lr on the edge" if row.edge else ""))
        line, = ax.plot(median.index, median.values, "o",
                        label=f"N = {row.n:g}: B_crit {row.b_crit:.0f} [{row.low:.0f}, {row.high:.0f}] ({state})")
        ax.plot(mine["batch_size"][fitted], mine["steps"][fitted], ".", color=line.get_color(), alpha=0.4)
        ax.plot(mine["batch_size"][~fitted], mine["steps"][~fitted], "o", color=line.get_color(), mfc="none")
        if np.isfinite(row.b_crit) and len(median):
            b = np.geomspace(median.index.min(), median.index.max(), 50)
            ax.plot(b, row.s_min * (1 + row.b_crit / b), "-", color=line.get_color(), lw=1)
    ax.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="steps to the target",
           title="B_crit in the designs' own setting")
    ax.legend(fontsize=7)
    points = f"{100 * MARGIN:g} point" + ("" if 100 * MARGIN == 1 else "s")
    return (f"Steps to the designs' target (B = {TARGET_BATCH}'s mean test accuracy at {TARGET_EPOCHS:g} epochs at "
            f"its best lr, less {points}) "
            "against the batch size, per N: dots, each seed at its held-out best lr; filled markers, the median over "
            f"the seeds at the batch sizes in the fit (at least {min_reached} seeds reached the target); open "
            "markers, the seeds of the other batch sizes; lines, McCandlish's S_min (1 + B_crit / B) fitted to the "
            "seeds (B_crit with its 95% bootstrap interval over seeds). The protocol counts B_crit as measured only "
            f"with at least {BCRIT_MIN_BATCHES} batch sizes in the fit and no held-out best lr on its grid's edge.")


def report_bcrit_own_setting(c: PredictorC, out: Path) -> None:
    """Notebooks 43 and 47: the own-setting sweep's steps to the target (`out`/b_crit_steps.csv) and their figure
    (`out`/b_crit_own_setting, bcrit_steps beside the fits), its caption naming where the test's c came from."""
    c.steps.to_csv(out / "b_crit_steps.csv", index=False)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    caption = bcrit_steps(ax, c.steps, c.table)
    save_figure(fig, out / "b_crit_own_setting", f"{caption} c: {c.source}.", runs=c.runs)
