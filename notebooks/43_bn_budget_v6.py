# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Steps, B/N or B/B_crit as the predictor of Hoffer's gap, protocol v6
#
# docs/protocols.md#v6-predictors. At one N the arms differ only in steps (Delta_S = the large batch at the small
# batch's steps minus at equal epochs); with the steps and examples of both batch sizes fixed, only B/N changes with
# N (Delta_N = the gap at 400 000 examples at 40k minus at 10k). `findings.bn_budget.predictor_gap_test` names the
# predictor and the verdict; the small-batch ladder says whether the small batch is under-trained at 10 epochs.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "bn_budget_hoffer_v6"                 # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/bn_budget_hoffer_v6"       # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/bn_budget_hoffer_v6.yaml"   # the spec: which variant each run belongs to
bcrit_sweep: str = "bn_budget_bcrit_v6"            # B_crit in the design's own setting (when it has run)
# version 5's c (plain SGD, train loss 0.3), from its committed report, when the own-setting B_crit has not run
fallback_c: str = "reports/bn_budget_goyal/test.csv"

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results
from bsresearch.findings import bn_budget
from bsresearch.plots import save_figure
from bsresearch.plots.findings import bn_budget as figures

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
own_c = bn_budget.read_predictor_c(bcrit_sweep, runs_dir, fallback_c)   # c, where it came from, the fits
c, c_source, bcrit = own_c.c, own_c.source, own_c.table
print(f"c = {c[0]:+.2f} [{c[1]:+.2f}, {c[2]:+.2f}] octaves: {c_source}")
if not bcrit.empty:
    bcrit.to_csv(out / "b_crit_own_setting.csv", index=False)

# %%
test = bn_budget.predictor_gap_test(runs, c)
print(f"VERDICT (Hoffer's gap, protocol v6): {test.verdict.upper()} - {test.why} (c: {c_source})")
pd.DataFrame([{"test": "gap (v6)", "predictor": test.predictor, "verdict": str(test.verdict), "why": test.why,
               "delta_n": test.delta_n[0], "delta_n_low": test.delta_n[1], "delta_n_high": test.delta_n[2],
               "c": c[0], "c_low": c[1], "c_high": c[2], "c_source": c_source}]).to_csv(out / "test.csv", index=False)
test.table.to_csv(out / "per_n.csv", index=False)
test.ladder.to_csv(out / "ladder.csv", index=False)
print(test.table.to_string(index=False))
print(test.ladder.to_string(index=False))

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
table = test.table.sort_values("n")
for column, label in (("gap_epochs", "LB - SB, equal epochs"), ("gap_examples", "LB - SB, equal examples (400k)"),
                      ("delta_s", "Delta_S: LB at SB's steps - LB at equal epochs")):
    y = 100 * table[column]
    axes[0].errorbar(table["n"], y, yerr=[y - 100 * table[f"{column}_low"], 100 * table[f"{column}_high"] - y],
                     marker="o", capsize=3, label=label)
for level in (-1, 1):
    axes[0].axhline(level, color="k", ls="--", lw=1)
axes[0].set(xscale="log", xlabel="N (training examples)", ylabel="test accuracy (points)",
            title=f"{test.predictor} ({test.verdict})")
axes[0].legend(fontsize=7)
ladder = test.ladder
y = 100 * ladder["u"]
axes[1].errorbar(range(len(ladder)), y, yerr=[y - 100 * ladder["low"], 100 * ladder["high"] - y], fmt="o", capsize=3)
axes[1].set_xticks(range(len(ladder)), [f"{n // 1000}k, {k}x" for n, k in zip(ladder["n"], ladder["k"])])
axes[1].axhline(0, color="grey", lw=0.5)
axes[1].set(ylabel="SB trained k x 10 epochs - SB at 10 (points)", title="is the small batch under-trained?")
caption = ("Left: per N, the large-batch gap at equal epochs and at equal examples, and Delta_S (steps x31 at one "
           "N), Welch 95% intervals, the +-1 point margins. Right: the small-batch ladder (Welch 95%). "
           f"Delta_N = {100 * test.delta_n[0]:+.2f} [{100 * test.delta_n[1]:+.2f}, {100 * test.delta_n[2]:+.2f}] "
           f"points; c from {c_source}. Verdict: {test.verdict} ({test.predictor}).")
save_figure(fig, out / "predictors", caption, runs=runs)
plt.show()

# %% [markdown]
# B_crit in the design's own setting (bn_budget_bcrit_v6), drawn once it has run: steps to the target against B per
# N and the fits in b_crit_own_setting.csv; c is read from it only where the protocol's rule counts it as measured.

# %%
if not bcrit.empty:
    figures.report_bcrit_own_setting(own_c, out)
    plt.show()
