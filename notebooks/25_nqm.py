# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Zhang et al. (2019): the noisy quadratic model — which algorithmic choices matter at which batch sizes
#
# L(theta) = 1/2 sum_i h_i theta_i^2 with h_i = 1/i (d = 10^4), mini-batch gradient noise covariance H/B,
# E theta_0^2 = 1. Steps to reach 1% of the initial loss, computed exactly from the second-moment
# recurrence (bsresearch.findings.nqm), with the learning rate (and momentum) tuned for every batch size. The paper:
# momentum and preconditioning extend perfect scaling to larger batch sizes (raise the critical batch size)
# and do not help at small batch sizes.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "nqm"              # the sweep to analyse (bsresearch report passes it)
runs_dir: str = "runs"              # root folder of run directories (relative: to the project)
out_dir: str = "reports/nqm"        # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = None     # the spec file (informational)
dim: int = 10_000                 # number of curvature directions (Zhang et al.: 10^4)
target_fraction: float = 0.01     # target: this fraction of the initial loss
max_batch_exponent: int = 17      # batch sizes 2^0 .. 2^max
lr_grid: list = [-4.0, 1.0, 41]   # np.logspace(*lr_grid): lrs 1e-4 .. 10, 10 per decade

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bsresearch.findings.nqm import NQM, steps_by_optimizer, steps_vs_batch_size
from bsresearch.measure.critical import fit_critical_batch
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.runtime import git_commit

out = project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)
model = NQM.zhang(dim)
target = target_fraction * model.initial_loss()
batch_sizes = [2 ** k for k in range(max_batch_exponent + 1)]
lrs = np.logspace(lr_grid[0], lr_grid[1], int(lr_grid[2]))
table = pd.DataFrame(steps_vs_batch_size(model, batch_sizes, target, lrs=lrs))
table.to_csv(out / "nqm_steps.csv", index=False)
print(f"initial loss {model.initial_loss():.4f}, target {target:.4f}; best lr on the grid edge for",
      int(table["lr_at_grid_edge"].sum()), "of", len(table), "points")
table.pivot(index="batch_size", columns="optimizer", values="steps")

# %%
fits = {name: fit_critical_batch(g["batch_size"], g["steps"]) for name, g in table.groupby("optimizer", sort=False)}
fit_table = pd.DataFrame([{"optimizer": n, "b_crit": f.b_crit, "b_crit_low": f.b_crit_interval[0],
                           "b_crit_high": f.b_crit_interval[1], "s_min": f.s_min,
                           "rms_log_residual": f.rms_log_residual,
                           "steps_at_batch_1": float(table[(table.optimizer == n)
                                                           & (table.batch_size == 1)]["steps"].iloc[0]),
                           "fewest_steps": float(table[table.optimizer == n]["steps"].min())}
                          for n, f in fits.items()])
fit_table.to_csv(out / "nqm_critical_batch.csv", index=False)
fit_table

# %%
fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
steps_by_optimizer(ax, table, fits)
ax.set_title(f"NQM, d = {dim}, target {target_fraction:.0%} of the initial loss", fontsize=10)
save_figure(fig, out / "nqm_steps", f"Noisy quadratic model (Zhang et al. 2019): steps to reach "
            f"{target_fraction:.0%} of the initial loss against batch size, "
            "lr (and momentum in {0, 0.5, 0.9, 0.99}) tuned per batch size "
            "on a log grid; exact expected loss, no sampling. Dotted: perfect scaling from batch 1; dashed: "
            f"B_crit of the fit S = S_min (1 + B_crit/B). Commit {git_commit()}.")
