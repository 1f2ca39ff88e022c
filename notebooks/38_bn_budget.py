# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # B/N, B/B_crit or the step budget: Goyal's break and Hoffer's gap (protocol v5)
#
# docs/protocols.md#bn-budget. Goyal's design (4 lrs per batch size, held-out best lr) and Hoffer's (LB 1000 against
# SB 32) at N = 10 000, 20 000 and 40 000, at equal epochs and at equal steps; B_crit at each N by steps to target.
# The tests (`findings.bn_budget.break_test`, `gap_test`) say which of B/N, B/B_crit or the number of steps predicts
# the break and the gap, and give each a verdict.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "bn_budget_goyal"                     # the Goyal design's sweep (its runs are in RUNS_DIR/SWEEP/)
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/bn_budget_goyal"           # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/bn_budget_goyal.yaml"   # the spec: which variant each run belongs to
bcrit_sweep: str = "bn_budget_bcrit"               # B_crit at each N (steps to target)
bcrit_extension_sweeps: str = "bn_budget_bcrit_ext"  # its edge rule's runs (read with it when run)
hoffer_sweep: str = "bn_budget_hoffer"             # the Hoffer design's sweep
# the Goyal design's lr grid extended at its edges and its seeds extended (protocol rules, each once), read with
# `sweep` (a sweep not run yet is skipped)
extension_sweeps: str = ("bn_budget_goyal_ext,bn_budget_goyal_seeds,bn_budget_goyal_seeds_ext,bn_budget_goyal_ext2,"
                         "bn_budget_goyal_ext3")

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results
from bsresearch.findings import bn_budget
from bsresearch.plots import save_figure
from bsresearch.plots.findings import bn_budget as figures

runs_dir, out, goyal_runs = results.start_report(sweep, runs_dir, out_dir, also=extension_sweeps)
goyal_runs = goyal_runs.assign(arm=goyal_runs["variant"].str[0].map({"e": "epochs", "s": "steps"}))
stt_runs = results.load([bcrit_sweep, *results.sweeps_run(bcrit_extension_sweeps, runs_dir)], runs_root=runs_dir)
hoffer_runs = results.load(hoffer_sweep, runs_root=runs_dir)
for name, table in ((sweep, goyal_runs), (bcrit_sweep, stt_runs), (hoffer_sweep, hoffer_runs)):
    print(f"{name}: {len(table)} runs", dict(table["state"].value_counts()))

# %% [markdown]
# ## B_crit at each N, then the two pre-registered tests

# %%
bcrit = bn_budget.critical_batch_by_n(stt_runs)
display_bcrit = bcrit.drop(columns=["fit"])
display_bcrit.to_csv(out / "b_crit_by_n.csv", index=False)
print(display_bcrit.to_string(index=False))
shift = bn_budget.bcrit_shift(bcrit)
breaks = bn_budget.goyal_breaks(goyal_runs)
testable = bn_budget.valid_at_ends(bcrit)        # valid: every best lr interior, >= 6 batch sizes in the fit
brk = bn_budget.break_test(breaks, shift, bcrit_valid=testable)
gap = bn_budget.gap_test(bn_budget.hoffer_gaps(hoffer_runs), shift, bcrit_valid=testable)
for row in bcrit[~bcrit["valid"]].itertuples():
    print(f"B_crit is not valid at N = {row.n}")
print("B/B_crit " + ("can be tested: B_crit is valid at the smallest and largest N, which c reads" if testable else
                     "is not testable: B_crit is not valid at the smallest or largest N (protocol v5)"))
tests = pd.DataFrame([{"test": t.effect, "predictor": t.predictor, "verdict": t.verdict, "why": t.why,
                       "shift": t.shift, "shift_low": t.shift_low, "shift_high": t.shift_high, "c": t.c,
                       "c_low": t.c_low, "c_high": t.c_high, "separable": t.separable, "extend_seeds": t.extend_seeds}
                      for t in (brk, gap)])
tests.to_csv(out / "test.csv", index=False)
print(f"VERDICT (Goyal's break, protocol v5): {brk.verdict.upper()} - predictor {brk.predictor}: {brk.why}")
print(f"VERDICT (Hoffer's gap, protocol v5): {gap.verdict.upper()} - predictor {gap.predictor}: {gap.why}")
breaks.to_csv(out / "breaks.csv", index=False)
bn_budget.break_cells(goyal_runs).to_csv(out / "break_cells.csv", index=False)   # per N, arm, B and lr
gap.table.to_csv(out / "gaps.csv", index=False)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
figures.break_vs_n(axes[0], brk, bcrit)
figures.gap_vs_n(axes[1], gap)
caption = ("Left: the smallest batch that fails at its held-out best lr against N, per arm, with the B/N and "
           "B/B_crit predictions. Right: large minus small batch test accuracy against N, per arm (Welch 95%), "
           "and the -1 point margin.")
save_figure(fig, out / "bn_budget", caption, runs=pd.concat([goyal_runs, stt_runs, hoffer_runs], ignore_index=True))
