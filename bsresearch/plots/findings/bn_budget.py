"""Figures of the B/N-or-steps tests (protocol versions 5 and 6): the break against N per arm, beside what B/N
and B_crit predict; the gap against N per arm."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from ...findings.bn_budget import BreakPredictorTest, PredictorTest

ARM_MARKERS = {"epochs": "o", "steps": "s", "examples": "^"}


def break_vs_n(ax: Axes, test: PredictorTest | BreakPredictorTest, bcrit: pd.DataFrame | None = None,
               anchor_arms: tuple[str, ...] = ("steps", "epochs")) -> None:
    """b(N, arm) for each arm of the test's table (a break beyond the grid drawn at 2x the largest batch, open
    marker), the B/N line through the smallest N's break of the first of `anchor_arms` that breaks somewhere and,
    if given, B_crit(N) scaled to it: the deciding statistic is the slope (version 5: the steps arm; version 6:
    the examples arm). The label says which arm the lines go through, so the predictions are drawn whenever some
    arm breaks."""
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
