# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 30 · The critical batch size of Adam against SGD with momentum: Zhang et al. (2019), Nado et al. (2021)
#
# **Claims.** Zhang et al.: with the lr re-tuned at every batch size, preconditioned optimizers (Adam) have a
# much larger critical batch size than SGD with momentum. Nado et al.: standard optimizers, well tuned, match
# the specialised large-batch ones; a large-batch advantage can come from tuning (B_crit(Adam) ~ B_crit(SGD)).
#
# **Here** (`experiments/adam_vs_sgd.yaml` and `adam_vs_sgd_seeds.yaml`, every setting justified there):
# MNIST-1D with 40000 signals, cnn1d, constant lr, steps until the train loss (first 4000 signals) is <= 0.5,
# B from 8 to 2048 (B/N <= 0.05), SGD momentum 0.9 and Adam, each with its lr tuned per batch size on seeds
# 1-2; seeds 3-5 at the chosen lr. B_crit of each from S = S_min (1 + B_crit/B) on every (B, seed) point.
#
# **Pre-registered test** (docs/protocols.md#adam-vs-sgd): rho = B_crit(Adam)/B_crit(SGD) with a 95% interval
# on log rho; reproduced when rho >= 2 and the two B_crit intervals do not overlap.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "adam_vs_sgd"                  # the selection sweep (seeds 1-2, three lrs per optimizer and B)
seeds_sweep: str = "adam_vs_sgd_seeds"      # the second stage (seeds 3-5 at the chosen lr); "" or absent: skip
runs_dir: str = "runs"                      # root folder of run directories (relative: to the project)
out_dir: str = "reports/adam_vs_sgd"        # figures and tables go here (relative: to the project)
spec_path: Optional[str] = None             # the spec file, for the record
selection_seeds: tuple = (1, 2)             # the seeds the lr is chosen on (the protocol's)
factor: float = 2.0                         # rho must reach this for "reproduced" (the protocol's)
confidence: float = 0.95                    # level of every interval

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from bsresearch import results
from bsresearch.findings.adam_vs_sgd import (
    compare_critical_batches,
    fittable,
    optimizer_fit,
    points_by_optimizer,
    seeds_overrides,
    tuned_by_optimizer,
)
from bsresearch.findings.steps_to_target import critical_batch_fits, local_exponents
from bsresearch.plots import save_figure
from bsresearch.plots.findings.adam_vs_sgd import steps_by_optimizer
from bsresearch.plots.findings.steps_to_target import steps_vs_lr

# the seeds sweep only once it has run (before stage 2: none)
runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir, also=seeds_sweep or "")
selection = runs[runs["seed"].isin(selection_seeds)]
best = tuned_by_optimizer(selection, confidence=confidence)
points = points_by_optimizer(runs, best)

# %% [markdown]
# ## The pre-registered test

# %%
test = compare_critical_batches(points, best, factor=factor, confidence=confidence)
verdict = pd.DataFrame([{
    "statistic": "rho = B_crit(Adam) / B_crit(SGD momentum)", "estimate": round(test.ratio, 3),
    f"{confidence:.0%} interval": f"[{test.low:.3g}, {test.high:.3g}]",
    "B_crit Adam": f"{test.b_crit_a:.3g} [{test.b_crit_a_interval[0]:.3g}, {test.b_crit_a_interval[1]:.3g}]",
    "B_crit SGD": f"{test.b_crit_b:.3g} [{test.b_crit_b_interval[0]:.3g}, {test.b_crit_b_interval[1]:.3g}]",
    "intervals overlap": test.intervals_overlap,
    "threshold": f"rho >= {factor:g} and no overlap", "verdict": test.verdict,
    f"rho within [1/{factor:g}, {factor:g}] (Nado's reading)": test.within_factor,
    "seeds per point": int(points.groupby(["optimizer", "batch_size"])["seed"].nunique().min()),
    "problems": "; ".join(test.problems) or "none"}])
verdict.to_csv(out / "test.csv", index=False)
display(verdict.T)

# %% [markdown]
# ## The second stage's lrs
# The lines to paste into `experiments/adam_vs_sgd_seeds.yaml` (its block "lr per (optimizer, B)").

# %%
overrides = seeds_overrides(best)
(out / "seeds_overrides.yaml").write_text(overrides + "\n")
print(overrides)

# %% [markdown]
# ## Secondary: the tuned lr, the fits, the scaling exponents

# %%
best.to_csv(out / "tuned.csv", index=False)
display(best[["optimizer", "batch_size", "lr", "interior", "lr_min", "lr_max", "n_seeds", "n_reached",
              "steps_mean", "steps_std"]])
names = fittable(points)   # optimizers with fit points at 2 or more batch sizes (none before the second stage)
fits = pd.concat([pd.DataFrame(columns=["optimizer", "fit"])] +
                 [critical_batch_fits(points[(points["optimizer"] == name) & points["in_fit"]],
                                      confidence=confidence).assign(optimizer=name) for name in names],
                 ignore_index=True)
second = points[~points["seed"].isin(selection_seeds) & points["in_fit"]]
if len(second):   # the fit on seeds 3-5 alone: free of the selection's optimism
    fits = pd.concat([fits] + [critical_batch_fits(g, confidence=confidence).query("fit == 'all seeds'")
                               .assign(optimizer=name, fit="second-stage seeds")
                               for name, g in second.groupby("optimizer") if g["batch_size"].nunique() >= 2],
                     ignore_index=True)
fits.to_csv(out / "fits.csv", index=False)
display(fits.reindex(columns=["optimizer", "fit", "n_points", "b_crit", "b_crit_low", "b_crit_high", "s_min",
                              "e_min", "rms_log_residual"]))
exponents = pd.concat([local_exponents(points[(points["optimizer"] == name) & points["in_fit"]]
                                       .groupby("batch_size", as_index=False)["steps_to_target"].mean(),
                                       steps="steps_to_target").assign(optimizer=name)
                       for name in names] + [pd.DataFrame(columns=["optimizer"])], ignore_index=True)
exponents.to_csv(out / "exponents.csv", index=False)
display(exponents)

# %%
fitted = {name: optimizer_fit(points, name, confidence=confidence) for name in names}
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
steps_by_optimizer(axes[0], points, fitted)
for ax, name in zip(axes[1:], sorted(selection["optimizer"].unique())):
    steps_vs_lr(ax, results.finished(selection[selection["optimizer"] == name], include_diverged=True))
    ax.set_title(f"{name}: selection seeds")
save_figure(fig, out / "steps_vs_batch",
            "Left: steps to the target (train loss on the eval_train_size subset) at the lr tuned per batch size, "
            "each seed in the fit (faint) and the mean, with S_min (1 + B_crit/B) per optimizer; B_crit dotted, "
            f"its {confidence:.0%} interval as a bar at the bottom. Middle, right: steps against the lr on the "
            "selection seeds, x = a seed that never reached the target.", runs=runs)
plt.show()
