# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # lr/B at a common train loss (Smith & Le 2018; Jastrzebski et al. 2017), protocol v5
#
# docs/protocols.md#lr-over-b. Every run is trained to the same full-train loss; along diagonals of constant lr/B
# the test (`findings.lr_over_b.equivalence_test`) asks over how wide a range of lr (and B) the test accuracy stays
# within 1 point of the diagonal's smallest lr, and where it stops.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lr_over_b_mnist1d"                   # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/lr_over_b_mnist1d"         # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/lr_over_b_mnist1d.yaml"   # the spec: which variant each run belongs to

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
test = lr_over_b.equivalence_test(runs)
print(f"VERDICT (lr/B at a common train loss, protocol v5): {test.verdict.upper()} - {test.why}")
if test.extend_seeds:
    print("PROVISIONAL: an undecided cell comes before a diagonal's span reaches 4 with "
          f"{runs['seed'].nunique()} seeds; the protocol adds seeds 45-47 once, and then judges")
lr_over_b.test_table(test).to_csv(out / "test.csv", index=False)   # with the verdict the gallery reads
test.cells.to_csv(out / "cells.csv", index=False)
print(test.per_diagonal.to_string(index=False))
table = lr_over_b.diagonal_table(runs)
table.to_csv(out / "diagonals.csv", index=False)

# %%
fig, ax = plt.subplots(figsize=(6, 4))
figures.difference_vs_lr(ax, test)
caption = ("Test accuracy at a common train loss minus that at the diagonal's smallest lr (Welch 95% interval "
           f"over seeds), against lr, per lr/B; the band is +-1 point; x: fewer than 3 seeds reached the target. "
           f"Verdict: {test.verdict} ({test.why}).")
save_figure(fig, out / "difference_vs_lr", caption, runs=runs)
plt.show()

# %% [markdown]
# ## Secondary (not the verdict)
# Test accuracy against lr/B at every lr (does it rise with the noise up to the edge of trainability?), the steps
# to the target per cell, and the same test at margins of 0.5 and 2 points.

# %%
fig, ax = plt.subplots(figsize=(6, 4))
accuracy = lr_over_b.accuracy_table(runs)
accuracy.to_csv(out / "accuracy_vs_lr_over_b.csv", index=False)
figures.accuracy_vs_lr_over_b(ax, accuracy)
save_figure(fig, out / "accuracy_vs_lr_over_b", "Test accuracy at a common train loss (mean and 95% t interval over "
            "the seeds that reached it) against lr/B, one line per lr.", runs=runs)
plt.show()
steps = lr_over_b.steps_table(runs)
steps.to_csv(out / "steps_to_target.csv", index=False)
margins = lr_over_b.margin_table(runs, (0.005, 0.01, 0.02))
margins.to_csv(out / "margins.csv", index=False)
print(margins.to_string(index=False))
