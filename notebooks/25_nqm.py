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
#
# **Pre-registered test** (docs/protocols.md#nqm), printed first: rho_mom = B_crit(heavy-ball momentum) /
# B_crit(SGD) and rho_pre = B_crit(preconditioned, P = H^-0.5) / B_crit(SGD), each B_crit from
# `fit_critical_batch` on the tuned steps over every batch size, with its 95% fit interval. Reproduced if
# both ratios are >= 2 and both intervals lie above SGD's; partly if one optimizer passes; not reproduced if
# neither; not testable if a tuned lr lies on the edge of the lr grid. No data set: the model is the
# infinite-data limit, so there is no B/N. Secondary: B_crit against the preconditioning power p, with and
# without momentum.

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
powers: list = [0.0, 0.25, 0.5, 0.75, 1.0]   # preconditioning powers p (preconditioner H^-p), secondary
power_lr_grid: list = [-6.0, 1.0, 71]   # lrs for the powers other than 0 and 0.5: strong preconditioning
                                        # amplifies the noise of small curvatures, small batches need lr < 1e-4

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bsresearch.findings.nqm import (
    NQM,
    critical_batch_by_power,
    grows_with_power,
    nqm_test,
    power_optimizers,
    steps_vs_batch_size,
)
from bsresearch.measure.critical import fit_critical_batch
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.plots.findings.nqm import critical_batch_vs_power, steps_by_optimizer
from bsresearch.runtime import git_commit

out = project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)
model = NQM.zhang(dim)
target = target_fraction * model.initial_loss()
batch_sizes = [2 ** k for k in range(max_batch_exponent + 1)]
lrs = np.logspace(lr_grid[0], lr_grid[1], int(lr_grid[2]))
table = pd.DataFrame(steps_vs_batch_size(model, batch_sizes, target, lrs=lrs))
table.to_csv(out / "nqm_steps.csv", index=False)
fits = {name: fit_critical_batch(g["batch_size"], g["steps"]) for name, g in table.groupby("optimizer", sort=False)}

# %% [markdown]
# ## The pre-registered test

# %%
test = nqm_test(fits, table)
sgd = test.b_crit["SGD"]


def show(b):   # (B_crit, low, high) -> "B_crit [low, high]"
    return f"{b[0]:.4g} [{b[1]:.4g}, {b[2]:.4g}]"


primary = pd.DataFrame([
    {"statistic": f"rho_{key} = B_crit({name}) / B_crit(SGD)", "estimate": rho,
     "B_crit [95% fit interval]": show(test.b_crit[name]), "SGD's B_crit": show(sgd),
     "threshold": "rho >= 2 and interval above SGD's", "passes": passes,
     "lrs on the grid edge": test.n_lr_at_grid_edge, "verdict": test.verdict}
    for key, name, rho, passes in (("mom", "heavy-ball momentum", test.rho_momentum, test.momentum_passes),
                                   ("pre", "preconditioned (p=0.5)", test.rho_precondition, test.precondition_passes))])
primary.to_csv(out / "nqm_test.csv", index=False)
print(f"VERDICT: {test.verdict} (rho_mom = {test.rho_momentum:.3g}, rho_pre = {test.rho_precondition:.3g}; "
      f"threshold >= 2 with B_crit intervals above SGD's [{sgd[1]:.4g}, {sgd[2]:.4g}]; "
      f"{test.n_lr_at_grid_edge} tuned lrs on the grid edge)")
primary.T

# %% [markdown]
# ## Secondary: the steps, the fits, and what the paper shows as figures

# %%
print(f"initial loss {model.initial_loss():.4f}, target {target:.4f}; best lr on the grid edge for",
      int(table["lr_at_grid_edge"].sum()), "of", len(table), "points")
table.pivot(index="batch_size", columns="optimizer", values="steps")

# %%
fit_table = pd.DataFrame([{"optimizer": n, "b_crit": f.b_crit, "b_crit_low": f.b_crit_interval[0],
                           "b_crit_high": f.b_crit_interval[1], "s_min": f.s_min,
                           "rms_log_residual": f.rms_log_residual,
                           "steps_at_batch_1": float(table[(table.optimizer == n)
                                                           & (table.batch_size == 1)]["steps"].iloc[0]),
                           "fewest_steps": float(table[table.optimizer == n]["steps"].min())}
                          for n, f in fits.items()])
fit_table.to_csv(out / "nqm_critical_batch.csv", index=False)
steps = table.pivot(index="batch_size", columns="optimizer", values="steps")
print("steps at B = 1, momentum / SGD:", f"{steps.loc[1.0, 'heavy-ball momentum'] / steps.loc[1.0, 'SGD']:.3f}",
      "(no help at small batch: within [0.9, 1.1])")
print("preconditioned / SGD steps, every B:",
      ", ".join(f"{r:.2f}" for r in steps["preconditioned (p=0.5)"] / steps["SGD"]))
both = fits["preconditioned + momentum"].b_crit
print(f"B_crit of preconditioning + momentum {both:.4g}: x{both / fits['heavy-ball momentum'].b_crit:.2f} "
      f"momentum's, x{both / fits['preconditioned (p=0.5)'].b_crit:.2f} preconditioning's")
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

# %% [markdown]
# ## Secondary: B_crit against the preconditioning power
#
# P = H^-p for each power p, with the lr (and, "with momentum", the momentum in {0, 0.5, 0.9, 0.99}) tuned
# per batch size as above (on a grid reaching lower lrs, `power_lr_grid`, for the new powers); p = 0 is
# SGD / heavy-ball momentum and p = 0.5 the preconditioner of the test (those rows are reused from the
# table above, not recomputed).

# %%
same = {"SGD": "p=0", "heavy-ball momentum": "p=0 + momentum", "preconditioned (p=0.5)": "p=0.5",
        "preconditioned + momentum": "p=0.5 + momentum"}
reused = table.assign(optimizer=table["optimizer"].map(same))
new = [p for p in powers if float(p) not in (0.0, 0.5)]
power_lrs = np.logspace(power_lr_grid[0], power_lr_grid[1], int(power_lr_grid[2]))
power_steps = pd.concat([reused, pd.DataFrame(steps_vs_batch_size(model, batch_sizes, target, lrs=power_lrs,
                                                                  optimizers=power_optimizers(new)))],
                        ignore_index=True)
power_steps = power_steps[power_steps["precondition"].isin([float(p) for p in powers])]
power_steps.to_csv(out / "nqm_power_steps.csv", index=False)
by_power = critical_batch_by_power(power_steps)
by_power.to_csv(out / "nqm_critical_batch_by_power.csv", index=False)
monotone = grows_with_power(by_power)
for momentum, grows in monotone.items():
    b = by_power[by_power["momentum"] == momentum].sort_values("power")
    print(f"{'with' if momentum else 'without'} momentum: B_crit " +
          " -> ".join(f"{v:.4g} (p={p:g})" for p, v in zip(b["power"], b["b_crit"])) +
          f": {'grows' if grows else 'does NOT grow'} monotonically with the power")
print("tuned lrs on the lr grid's edge:", int(by_power["n_lr_at_grid_edge"].sum()), "| batch sizes where no lr "
      "reached the target (left out of the fit; widen the grid):", int(by_power["n_unreached"].sum()))
by_power

# %%
fig, ax = plt.subplots(figsize=(5.2, 3.8), layout="constrained")
critical_batch_vs_power(ax, by_power)
ax.set_title(f"NQM, d = {dim}, target {target_fraction:.0%} of the initial loss", fontsize=10)
save_figure(fig, out / "nqm_critical_batch_vs_power", "Noisy quadratic model: the critical batch size B_crit of "
            "the fit S = S_min (1 + B_crit/B) against the preconditioning power p (P = H^-p), without momentum "
            "and with momentum tuned in {0, 0.5, 0.9, 0.99}; the lr tuned per batch size on the same grid; error "
            f"bars: the 95% fit interval. Batch sizes 2^0 .. 2^{max_batch_exponent}. Commit {git_commit()}.")
