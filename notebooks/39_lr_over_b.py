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
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.plots.findings import lr_over_b as figures

runs_dir, out = project_path(runs_dir), project_path(out_dir)
out.mkdir(parents=True, exist_ok=True)
runs = results.load(sweep, runs_root=runs_dir)
runs = runs.assign(reached=runs["reached_target"].fillna(False).astype(bool) & runs["state"].eq("ok"))
print(f"{len(runs)} runs:", dict(runs["state"].value_counts()), "| reached:", int(runs["reached"].sum()))

# %%
test = lr_over_b.equivalence_test(runs)
print(f"VERDICT (lr/B at a common train loss, protocol v5): {test.verdict.upper()} - {test.why}")
if test.extend_seeds:
    print("an undecided cell comes before a diagonal's span reaches 4: seeds 45-47 are added once")
test.per_diagonal.to_csv(out / "test.csv", index=False)
test.cells.to_csv(out / "cells.csv", index=False)
print(test.per_diagonal.to_string(index=False))
lr_over_b.diagonal_table(runs).to_csv(out / "diagonals.csv", index=False)

# %%
fig, ax = plt.subplots(figsize=(6, 4))
figures.difference_vs_lr(ax, test)
caption = ("Test accuracy at a common train loss minus that at the diagonal's smallest lr (Welch 95%), against "
           "lr, per lr/B; the band is +-1 point; x: fewer than 3 seeds reached the target.")
save_figure(fig, out / "difference_vs_lr", caption)
