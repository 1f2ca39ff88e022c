# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # lr/B at a common train loss, protocol v6: the effect of lr at fixed lr/B against the effect of lr/B
#
# docs/protocols.md#v6-lr-over-b. Per seed, the test accuracy of the runs that reached the common train loss is
# regressed on log2 lr and log2 lr/B; rho = (mean lr slope) / (mean lr/B slope) with its Fieller interval
# (`findings.lr_over_b.ratio_test`), once the lr/B slope is shown to be above 0 (the precondition: otherwise the
# verdict is not testable, not "not reproduced"). Reproduced when rho's interval lies inside +-1/4.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lr_over_b_v6_mnist1d"                # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/lr_over_b_v6_mnist1d"      # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/lr_over_b_v6_mnist1d.yaml"   # the spec: which variant each run belongs to

# %%
import matplotlib.pyplot as plt

from bsresearch import results
from bsresearch.findings import lr_over_b
from bsresearch.plots import save_figure
from bsresearch.plots.findings import lr_over_b as figures

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
runs = runs.assign(reached=runs["reached_target"].fillna(False).astype(bool) & runs["state"].eq("ok"))
print(f"{int(runs['reached'].sum())} of {len(runs)} runs ended ok at the target train loss")

# %%
test = lr_over_b.ratio_test(runs)
print(f"VERDICT (lr at fixed lr/B against lr/B, protocol v6): {test.verdict.upper()} - {test.why}")
if test.extend_seeds:
    print(f"PROVISIONAL: rho's interval straddles +-1/4 with {test.n_seeds} seeds; the protocol adds seeds 55-57 "
          "once, and then judges")
lr_over_b.ratio_table(test).to_csv(out / "test.csv", index=False)
test.per_seed.to_csv(out / "per_seed.csv", index=False)
print(test.per_seed.to_string(index=False))
lr_over_b.diagonal_table(runs).to_csv(out / "diagonals.csv", index=False)

# %%
fig, ax = plt.subplots(figsize=(6, 4))
accuracy = lr_over_b.accuracy_table(runs)
accuracy.to_csv(out / "accuracy_vs_lr_over_b.csv", index=False)
figures.accuracy_vs_lr_over_b(ax, accuracy)
caption = ("Test accuracy at a common train loss (mean and 95% t interval over the seeds that reached it) against "
           "lr/B, one line per lr: lr/B's effect is the lines' slope, lr's effect at fixed lr/B their spread. "
           f"The test: {test.why}. Verdict: {test.verdict}.")
save_figure(fig, out / "accuracy_vs_lr_over_b", caption, runs=runs)
plt.show()

# %% [markdown]
# ## Secondary (not the verdict)
# Version 5's equivalence test on these runs (the span in lr of each diagonal at a 1-point margin).

# %%
equivalence = lr_over_b.equivalence_test(runs)
print(f"secondary, version 5's test on these runs: {equivalence.verdict} - {equivalence.why}")
equivalence.per_diagonal.to_csv(out / "secondary_equivalence.csv", index=False)
