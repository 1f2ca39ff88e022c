# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Steps, B/N or B/B_crit as the predictor of Goyal's break, protocol v6
#
# docs/protocols.md#v6-predictors. Goyal's design at N = 10k, 20k and 40k in three arms: equal epochs (20), equal
# steps (1000 for every B > 32) and equal examples (800 000 at every N, so each B has the same steps at every N and
# only B/N changes). A: the epochs arm breaks at a smaller B than the steps arm at every N (steps matter at fixed
# B/N). s_X: how far the examples arm's break moves from 10k to 40k (steps predict 0 octaves, B/N 2, B/B_crit c).
# `findings.bn_budget.predictor_break_test` names the predictor and the verdict; c comes from B_crit measured in
# the design's own setting where that has run and is valid, else from version 5's plain-SGD c, as the protocol says.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "bn_budget_goyal_v6"                  # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/bn_budget_goyal_v6"        # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/bn_budget_goyal_v6.yaml"   # the spec: which variant each run belongs to
bcrit_sweep: str = "bn_budget_bcrit_v6"            # B_crit in the design's own setting (when it has run)
# version 5's c (plain SGD, train loss 0.3), from its committed report, when the own-setting B_crit is not measured
fallback_c: str = "reports/bn_budget_goyal/test.csv"

# %%
import math

import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results
from bsresearch.findings import bn_budget
from bsresearch.plots import save_figure
from bsresearch.plots.findings import bn_budget as figures

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
runs = runs.assign(arm=runs["variant"].str[0].map({"e": "epochs", "s": "steps", "x": "examples"}))
own_c = bn_budget.read_predictor_c(bcrit_sweep, runs_dir, fallback_c)   # c, where it came from, the fits
c, c_source, bcrit = own_c.c, own_c.source, own_c.table
print(f"{sweep}: {len(runs)} runs", dict(runs["state"].value_counts()))
print(f"c = {c[0]:+.2f} [{c[1]:+.2f}, {c[2]:+.2f}] octaves: {c_source}")
if not bcrit.empty:
    bcrit.to_csv(out / "b_crit_own_setting.csv", index=False)
    print(bcrit.to_string(index=False))

# %%
breaks = bn_budget.goyal_breaks(runs)
test = bn_budget.predictor_break_test(breaks, c)
print(f"VERDICT (Goyal's break, protocol v6): {test.verdict.upper()} - predictor {test.predictor}: {test.why} "
      f"(c: {c_source})")
pd.DataFrame([{"test": "break (v6)", "predictor": test.predictor, "verdict": str(test.verdict), "why": test.why,
               "steps_matter": test.steps_matter, "shift": test.shift, "shift_censored": test.shift_censored,
               "c": c[0], "c_low": c[1], "c_high": c[2], "c_source": c_source,
               "extend_seeds": test.extend_seeds}]).to_csv(out / "test.csv", index=False)
breaks.to_csv(out / "breaks.csv", index=False)
bn_budget.break_cells(runs).to_csv(out / "break_cells.csv", index=False)   # per N, arm, B and lr
print(breaks.to_string(index=False))

# %%
fig, ax = plt.subplots(figsize=(6, 4))
figures.break_vs_n(ax, test, anchor_arms=("examples", "steps", "epochs"))   # B/B_crit: the slope of the c used
shift = "undefined" if math.isnan(test.shift) else f"{test.shift:+g}" + (" (a lower bound)" if test.shift_censored
                                                                           else "")
caption = ("The smallest batch that fails at its held-out best lr against N, per arm (equal epochs, equal steps, "
           "equal examples; a break beyond the grid drawn at 2x the largest batch, open marker), with the B/N line "
           "and the B/B_crit line of the c the test used, both through one arm's break at its smallest N (the "
           f"legend names it). s_X = {shift} octaves; A (steps matter) "
           f"{'holds' if test.steps_matter else 'fails'}; c = {c[0]:+.2f} [{c[1]:+.2f}, {c[2]:+.2f}] from "
           f"{c_source}. Verdict: {test.verdict} ({test.predictor}).")
save_figure(fig, out / "predictors", caption, runs=runs)
plt.show()

# %% [markdown]
# B_crit in the design's own setting (bn_budget_bcrit_v6), drawn once it has run: steps to the target against B per
# N and the fits in b_crit_own_setting.csv; c is read from it only where the protocol's rule counts it as measured.

# %%
if not bcrit.empty:
    figures.report_bcrit_own_setting(own_c, out)
    plt.show()
