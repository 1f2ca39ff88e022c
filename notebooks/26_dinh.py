# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Dinh et al. (2017): sharp minima can generalize — a reparameterisation changes sharpness, not the function
#
# For ReLU networks, multiplying one layer by alpha > 0 and the next by 1/alpha leaves the function (and so
# train and test loss and accuracy) unchanged, yet changes curvature-based sharpness arbitrarily. We apply
# this to the first two conv layers of trained MNIST-1D CNNs (the Keskar sweep's small- and large-batch
# solutions) and measure, for each alpha: the largest change of the outputs, Keskar's phi, the top Hessian
# eigenvalue, the Hessian trace, worst-case sharpness (L2 ball), and adaptive worst-case and average-case
# sharpness (Kwon et al. 2021), which should not change.
#
# **Pre-registered test** (docs/protocols.md#dinh): Lambda = the smallest, over all models (batch 32 and
# 4000, seeds 0-4 of the Keskar sweep: 10 models), of (top Hessian eigenvalue at alpha = 10) / (at
# alpha = 1). Reproduced: Lambda >= 10; partly: 2 <= Lambda < 10; not reproduced: Lambda < 2. No interval:
# the claim is about every model. Validity: the function is unchanged, i.e. for every model and alpha the
# largest absolute change of any output logit is at most 1e-4 x the largest absolute logit; else not
# testable.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "dinh"              # the sweep to analyse (bsresearch report passes it)
runs_dir: str = "runs"              # root folder of run directories (relative: to the project)
out_dir: str = "reports/dinh"       # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = None     # the spec file (informational)
source_sweep: str = "keskar"        # trained models to reparameterise (their checkpoints)
batch_sizes: list = [32, 4000]      # which of its runs
seeds: list = [0, 1, 2, 3, 4]       # all seeds of the Keskar sweep (the test is over every model)
alphas: list = [0.1, 0.3, 1.0, 3.0, 10.0]
pair: int = 0                       # rescale weighted layers (pair, pair + 1): conv1 x alpha, conv2 / alpha
test_alpha: float = 10.0            # the test's rescaling: Lambda is the smallest per-model eigenvalue ratio at it
reproduced_at: float = 10.0         # reproduced when Lambda is at least this
partly_at: float = 2.0              # partly when Lambda is at least this (and below reproduced_at)
tolerance: float = 1e-4             # validity: the largest output change is at most tolerance x the largest logit

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.findings import dinh
from bsresearch.plots import figure_grid, save_figure
from bsresearch.plots.findings.dinh import measure_vs_alpha

runs_dir, out, source = results.start_report(source_sweep, runs_dir, out_dir)
source = results.finished(source)
chosen = source[source.batch_size.isin(batch_sizes) & source.seed.isin(seeds)]
n_train = int(chosen["n_train"].max())
print(f"{len(chosen)} trained models of {source_sweep} (batch sizes {sorted(set(chosen.batch_size))}, seeds "
      f"{sorted(set(chosen.seed))}); largest B/N = {int(chosen.batch_size.max())}/{n_train} = "
      f"{chosen.batch_size.max() / n_train:.3g}")
table = dinh.rescaling_table(chosen, alphas, pair)
table.to_csv(out / "dinh_runs.csv", index=False)

# %% [markdown]
# ## The pre-registered test

# %%
test = dinh.rescaling_test(table, "top_eigenvalue", alpha=test_alpha, reproduced_at=reproduced_at,
                           partly_at=partly_at, tolerance=tolerance, n_models=len(batch_sizes) * len(seeds))
print(f"VERDICT: {test.verdict} ({test.why})")
print(f"Lambda = min over {test.n_models} models of top eigenvalue(alpha {test_alpha:g}) / (alpha 1) = "
      f"{test.smallest_ratio:.4g} (model batch {test.smallest_model[0] if test.smallest_model else '-'}, seed "
      f"{test.smallest_model[1] if test.smallest_model else '-'}; largest {test.largest_ratio:.4g}); threshold: "
      f"reproduced if >= {reproduced_at:g}, partly if >= {partly_at:g}")
print(f"validity: max |output change| / max |logit| = {test.max_relative_change:.2g} (must be <= {tolerance:g})")
ratios = dinh.per_model_ratios(table, "top_eigenvalue", test_alpha)
validity = table.groupby(["batch_size", "seed"], as_index=False).agg(
    max_output_change=("max_output_change", "max"), max_abs_logit=("max_abs_logit", "max"))
per_model = ratios.merge(validity, on=["batch_size", "seed"])
per_model.to_csv(out / "test.csv", index=False)
per_model.rename(columns={"value_ref": "top eigenvalue alpha 1", "value_alpha": f"alpha {test_alpha:g}"})

# %% [markdown]
# ## Secondary statistics
#
# Absolute values of every measure for the small (32) and the large batch (4000) at alpha = 1 and at
# alpha = 10 (sharper) and 0.1 (flatter), beside the per-model ratios (smallest, mean, largest).

# %%
measures = ["train_loss", "test_acc", "keskar_phi", "top_eigenvalue", "hessian_trace", "worst_case",
            "adaptive_worst_case", "adaptive_average_case"]
absolute = pd.concat([dinh.absolute_and_ratios(table, measures, alpha=a).assign(alpha=a)
                      for a in [test_alpha, 0.1]], ignore_index=True)
absolute.to_csv(out / "dinh_absolute_and_ratios.csv", index=False)
summary = stats.summarize(table, ["batch_size", "alpha"], ["max_output_change", "max_abs_logit", *measures])
summary.to_csv(out / "dinh_summary.csv", index=False)
absolute.round(4)

# %%
# the ordering reversed? the small-batch model rescaled by alpha 10 against the large-batch one unscaled
eig = table.pivot_table(index=["seed"], columns=["batch_size", "alpha"], values="top_eigenvalue")
if (min(batch_sizes), test_alpha) in eig and (max(batch_sizes), 1.0) in eig:
    sharper = eig[(min(batch_sizes), test_alpha)] > eig[(max(batch_sizes), 1.0)]
    print(f"top eigenvalue: batch {min(batch_sizes)} at alpha {test_alpha:g} above batch {max(batch_sizes)} at "
          f"alpha 1 for {int(sharper.sum())} of {len(sharper)} seeds")
# adaptive sharpness should not move: its largest relative change over every model and alpha
for m in ["adaptive_worst_case", "adaptive_average_case", "train_loss"]:
    r = pd.concat([dinh.per_model_ratios(table, m, a)["ratio"] for a in alphas if a != 1.0])
    print(f"{m}: max |value / value at alpha 1 - 1| = {float((r - 1).abs().max()):.2g}")

# %%
shown = {"top_eigenvalue": "top Hessian eigenvalue", "hessian_trace": "Hessian trace", "keskar_phi": "Keskar phi (%)",
         "worst_case": "worst-case sharpness (rho 0.05)", "adaptive_worst_case": "adaptive worst-case (rho 0.5)",
         "adaptive_average_case": "adaptive average-case (sigma 0.05)", "train_loss": "train loss (the function)",
         "test_acc": "test accuracy (the function)"}
fig, axes = figure_grid(len(shown), width=3.4, height=2.8, ncols=4)
for ax, (column, label) in zip(axes, shown.items()):
    measure_vs_alpha(ax, table, column, title=label)
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), fontsize="small")
save_figure(fig, out / "dinh_reparameterisation", "Dinh et al. on MNIST-1D: the first conv layer multiplied by "
            "alpha and the second divided by alpha (the same function: outputs unchanged to float precision). One "
            "panel per measure, absolute values against alpha (log axis), for the models trained at batch "
            f"{' and '.join(str(b) for b in batch_sizes)} (thin: each seed; thick: mean over seeds "
            f"{seeds}). A panel's note gives the largest change relative to alpha = 1 over every model; "
            "'unchanged' below 1%.", runs=chosen)
plt.show()
