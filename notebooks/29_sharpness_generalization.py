# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Sharpness against generalization
#
# Keskar et al. 2017; Dinh et al. 2017; Jiang et al. 2020; Andriushchenko et al. 2023.
#
# **Question.** Over runs that differ in batch size and learning rate, which of the toolkit's measures rank
# the runs by their generalization gap, overall and within slices where only the batch size or only the lr
# varies? Keskar: sharper minima generalize worse. Dinh: sharpness is not reparameterisation-invariant.
# Jiang et al.: worst-case sharpness is among the best predictors (tau ~0.1-0.3 overall, higher within
# slices). Andriushchenko et al.: sharpness often tracks the hyperparameters more than the gap.
#
# **Here** (`experiments/sharpness_generalization.yaml`, every setting justified there): MNIST-1D (N = 4000),
# cnn1d, SGD momentum 0.9, constant lr; B in {16, 64, 256, 1024} (largest B/N = 0.26) x lr in {0.01, 0.03,
# 0.1}; every run trained to full-train loss 0.01; 5 seeds; all after-training measurements.
#
# **Pre-registered test** (docs/protocols.md#sharpness-generalization): Kendall tau of each measure with the
# loss gap (test - train) over the runs that reached the target, in three scopes (all runs; varying batch
# size within each lr and seed; varying lr within each batch size and seed), 95% percentile bootstrap
# intervals over seeds. Reproduced when worst-case sharpness and adaptive m-sharpness hold (interval above
# 0) in every scope; partly when some sharpness measure holds; not reproduced when none holds anywhere.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "sharpness_generalization"             # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                              # root folder of run directories (relative: to the project)
out_dir: str = "reports/sharpness_generalization"   # figures and tables go here (relative: to the project)
spec_path: Optional[str] = "experiments/sharpness_generalization.yaml"  # the spec: which variant each run is
gap: str = "gap_loss"                               # the primary gap: test loss - train loss (final)
secondary_gap: str = "gap_acc"                      # secondary: train accuracy - test accuracy
n_boot: int = 2000                                  # bootstrap resamples of the seeds (the protocol's 2000)
n_boot_secondary: int = 2000                        # resamples for the secondary tables (fewer: faster)
confidence: float = 0.95                            # of every interval

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.findings import sharpness_generalization as sg
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.plots.findings import sharpness_generalization as sg_plots
from bsresearch.sweep import variants
from bsresearch.sweep.spec import load_spec

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
rows = variants.runs_per_variant(runs, load_spec(project_path(spec_path))) if spec_path else runs
# the protocol's population: runs that ended ok and reached the target train loss (equally fit)
ok = rows[(rows["state"] == "ok") & rows["reached_target"].eq(True)].reset_index(drop=True)
n_train = int(rows["n_train"].iloc[0])
setting = (f"{rows['dataset'].iloc[0]} ({n_train} training examples; largest B/N = "
           f"{rows['batch_size'].max() / n_train:.3g}), {rows['model'].iloc[0]}, target train loss "
           f"{rows['target_loss'].iloc[0]:g}")
print(f"{len(rows)} runs:", rows["state"].value_counts().to_dict(), f"| reached the target: {len(ok)}",
      "| budget:", results.budget_description(rows))
print(setting)

# %% [markdown]
# ## The pre-registered test

# %%
taus = sg.rank_correlations(ok, gap, n_boot=n_boot, confidence=confidence)
test = sg.finding_test(taus)
pct = int(round(100 * confidence))
primary = test.deciding.assign(**{
    f"{pct}% bootstrap interval": lambda t: [f"[{lo:.3f}, {hi:.3f}]" for lo, hi in zip(t["low"], t["high"])],
    "threshold": "interval above 0"})[["measure", "scope", "tau", f"{pct}% bootstrap interval", "threshold",
                                       "holds", "n_runs"]]
primary.assign(verdict=test.verdict, reason=test.reason).to_csv(out / "test.csv", index=False)
(out / "test.md").write_text(f"Kendall tau with {gap}; {setting}; {n_boot} resamples of the seeds.\n"
                             f"{results.provenance_caption(ok)}\n\nVERDICT: {test.verdict} ({test.reason})\n\n"
                             + stats.frame_markdown(primary))
print(f"VERDICT: {test.verdict} ({test.reason})")
primary

# %%
# every measure, every scope (the table the verdict reads): holds / opposite / no; for the measures without a
# predicted sign (B_simple, distance from initialisation): positive / negative / no
taus.to_csv(out / "taus.csv", index=False)
(out / "taus.md").write_text(f"Kendall tau with {gap}.\n{results.provenance_caption(ok)}\n\n"
                             + stats.frame_markdown(taus, digits=3))
taus.pivot(index="measure", columns="scope", values="holds").reindex(list(dict.fromkeys(taus["measure"])))

# %% [markdown]
# ## Secondary: do the measures track the hyperparameters more than the gap? The gap in accuracy

# %%
hyper = pd.concat([sg.rank_correlations(ok, h, n_boot=n_boot_secondary, confidence=confidence).assign(with_=h)
                   for h in ("batch_size", "lr")], ignore_index=True).rename(columns={"with_": "with"})
# tau with the batch size is defined overall and where the batch size varies; with the lr, likewise
hyper = hyper[(hyper["scope"] == "all") | (hyper["scope"] == "varying " + hyper["with"])]
acc = sg.rank_correlations(ok, secondary_gap, n_boot=n_boot_secondary, confidence=confidence)
secondary = pd.concat([taus.assign(**{"with": gap}), hyper, acc.assign(**{"with": secondary_gap})],
                      ignore_index=True)[["with", "measure", "scope", "tau", "low", "high", "holds", "n_runs"]]
secondary.to_csv(out / "taus_secondary.csv", index=False)
(out / "taus_secondary.md").write_text(results.provenance_caption(ok) + "\n\n" + stats.frame_markdown(secondary, 3))
secondary[secondary["scope"] == "all"].pivot(index="measure", columns="with", values="tau")

# %%
measures = [m for m in sg.MEASURES if m in ok]
summary = stats.summarize(ok, ["batch_size", "lr"], [gap, secondary_gap, "steps", *measures], confidence)
summary.to_csv(out / "summary.csv", index=False)
(out / "summary.md").write_text(results.provenance_caption(ok) + "\n\n" + stats.markdown_table(
    summary, ["batch_size", "lr"], [gap, secondary_gap, "steps", *measures], digits=3))
# runs per cell that reached the target train loss (the others are left out of every tau)
rows.pivot_table(index="batch_size", columns="lr", values="reached_target",
                 aggfunc=lambda s: int(s.eq(True).sum())).rename_axis("runs at the target")

# %% [markdown]
# ## Figures: tau per measure and scope; the gap against each measure

# %%
fig, ax = plt.subplots(figsize=(7, 0.45 * len(measures) + 1.2), layout="constrained")
sg_plots.correlation_plot(ax, taus)
save_figure(fig, out / "taus",
            f"Kendall tau between each measure and the generalization gap ({gap}: test - train loss) over the runs "
            f"that reached the target train loss, with {pct}% percentile bootstrap intervals over seeds "
            f"({n_boot} resamples); scopes: all runs, varying batch size (within each lr and seed, mean over "
            f"slices), varying lr (within each batch size and seed). Verdict: {test.verdict}. Setting: {setting}.",
            runs=ok)
plt.show()

# %%
cols = 4
fig, axes = plt.subplots(-(-len(measures) // cols), cols, figsize=(3.4 * cols, 2.9 * -(-len(measures) // cols)),
                         layout="constrained", squeeze=False)
for i, (ax, m) in enumerate(zip(axes.flat, measures)):
    sg_plots.gap_scatter(ax, ok, m, gap, legend=i == 0)
for ax in list(axes.flat)[len(measures):]:
    ax.set_visible(False)
save_figure(fig, out / "gap_scatter",
            f"The generalization gap ({gap}) against each measure, one point per run that reached the target "
            f"train loss: colour by batch size, marker by lr. Setting: {setting}.", runs=ok)
plt.show()
