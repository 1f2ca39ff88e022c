# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Hoffer et al. (2017) on MNIST-1D: train longer, generalize better
#
# **Claim** (SCIENCE.md): the large-batch generalization gap closes with sqrt lr scaling, ghost batch norm
# (BatchNorm statistics over ghost batches, 128 in the paper) and "regime adaptation" (as many updates as
# the small batch, the schedule stretched with them); the distance from initialisation grows like log(t).
#
# **Here** (`experiments/hoffer.yaml`, every setting justified there): cnn1d with BatchNorm, SGD momentum
# 0.9, lr 0.05 at batch 32 (library default, not tuned), step schedule x0.1 at 1/3, 2/3, 8/9 of the run.
# SB = 32 for 18 epochs against LB = 1000 under all 8 combinations of sqrt scaling (`sqrt`), ghost BN of
# 32 (`gbn`) and regime adaptation (`ra`: 2250 steps = SB's number of updates); 3 seeds each.
# This notebook writes `variants.csv/.md` (per variant), `versus_sb.csv` (each variant minus SB, Welch
# interval), `ingredient_effects.csv` (each ingredient added with the others fixed), `distance_fits.csv`
# (log-t fits; per run in `distance_fits_per_run.csv`) and the figures.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "hoffer"                              # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/hoffer"                    # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/hoffer.yaml"     # the spec: which variant each run belongs to
reference: str = "sb"                              # the small-batch variant every other is compared with
fit_t_min: float = 10.0                            # first step of the distance fit (skips the first updates)

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.findings import hoffer
from bsresearch.findings.hoffer import distance_vs_steps, variant_points
from bsresearch.paths import project_path, require_sweep
from bsresearch.plots import figure_grid, learning_curves, save_figure
from bsresearch.plots.sweeps import variant_colors
from bsresearch.sweep import variants
from bsresearch.sweep.spec import load_spec

runs_dir, out = project_path(runs_dir), project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)
require_sweep(sweep, runs_dir)
spec = load_spec(project_path(spec_path))
order = variants.variant_order(spec)
colors = variant_colors(order)                     # one colour per variant in every figure
runs = results.load(sweep, runs_root=runs_dir)
rows = results.generalization_gap(variants.runs_per_variant(runs, spec))
ok = rows[rows["state"] == "ok"]
print(f"{len(rows)} runs:", dict(rows["state"].value_counts()), "| budget:", results.budget_description(rows))

# %%
# per variant: mean, std and 95% t-interval over seeds
metrics = ["test_acc", "train_acc", "gap_acc", "train_loss", "test_loss", "gap_loss", "steps", "epochs",
           "effective_lr", "distance_from_init", "train_seconds"]
table = stats.summarize_states(rows, "variant", metrics).set_index("variant").loc[order].reset_index()
table.to_csv(out / "variants.csv", index=False)
shown = ["test_acc", "train_acc", "gap_acc", "train_loss", "steps", "effective_lr", "distance_from_init"]
(out / "variants.md").write_text(results.provenance_caption(rows) + "\n\n"
                                 + stats.markdown_table(table, ["variant"], shown, counts=("n", "n_diverged")))
print(stats.markdown_table(table, ["variant"], shown, counts=("n", "n_diverged")))

# %%
# each variant minus the small batch (Welch 95% interval over seeds): has the gap closed?
versus = pd.concat([stats.versus_reference(rows, m, {"variant": reference}).assign(metric=m)
                    for m in ["test_acc", "gap_acc", "train_loss"]], ignore_index=True)
versus.to_csv(out / "versus_sb.csv", index=False)
versus_wide = versus.pivot(index="variant", columns="metric", values=["diff", "low", "high"])
versus_wide.reindex(order).dropna(how="all").round(4)

# %%
# each ingredient's effect with the others held fixed: the LB variants form a 2^3 factorial design
lb_variants = [v for v in order if v != reference]
effects = pd.concat([hoffer.ingredient_effects(rows, m, lb_variants).assign(metric=m)
                     for m in ["test_acc", "gap_acc", "distance_from_init"]], ignore_index=True)
effects.to_csv(out / "ingredient_effects.csv", index=False)
effects[effects["metric"] == "test_acc"].round(4)

# %%
fig, axes = figure_grid(2, width=4.6, height=3.6)
variant_points(axes[0], rows, table, "test_acc", order=order)
variant_points(axes[1], rows, table, "gap_acc", order=order)
axes[1].set_yticklabels([])
save_figure(fig, out / "test_acc_and_gap",
            "Hoffer et al. on MNIST-1D: final test accuracy (left) and generalization gap, train minus test "
            "accuracy (right), per variant: sb = batch 32; lb = batch 1000 with sqrt lr scaling (sqrt), ghost "
            "BatchNorm over 32 examples (gbn), regime adaptation to SB's 2250 updates (ra). Mean and 95% "
            "t-interval over seeds, seeds as grey points.", runs=rows)
plt.show()

# %% [markdown]
# ## Distance from initialisation against log(steps)
#
# Hoffer et al. argue that the weights diffuse "ultra-slowly", |w_t - w_0| ~ log t, so a large batch that
# takes fewer updates cannot travel as far. We fit d = a + b ln t per run over the steps from `fit_t_min`
# to the end of the first (constant) lr phase, and, as the alternative, d = c t^alpha (a random walk at a
# fixed step size has alpha = 1/2); both R^2 are computed on d.

# %%
history = results.load_history(ok, ["variant", "batch_size", "seed", "lr_scaling", "ghost_batch_size", "budget"])
fits = hoffer.distance_fits(history, by=("variant", "seed"), t_min=fit_t_min)
fits.to_csv(out / "distance_fits_per_run.csv", index=False)
fit_table = stats.summarize(fits, "variant", ["slope", "intercept", "r2", "alpha", "r2_power", "t_max", "n_points"])
fit_table = fit_table.set_index("variant").loc[[v for v in order if v in set(fit_table["variant"])]].reset_index()
fit_table.to_csv(out / "distance_fits.csv", index=False)
print(stats.markdown_table(fit_table, ["variant"], ["slope", "r2", "alpha", "r2_power", "t_max"]))

# %%
same_epochs = [v for v in order if not v.endswith("_ra")]
same_updates = [v for v in order if v == reference or v.endswith("_ra")]
fig, axes = figure_grid(2, width=5.2, height=3.8)
distance_vs_steps(axes[0], history, fits, order=same_epochs, colors=colors)
axes[0].set_title("same epochs (18)", fontsize="medium")
distance_vs_steps(axes[1], history, fits, order=same_updates, colors=colors)
axes[1].set_title("same updates (2250): regime adaptation", fontsize="medium")
save_figure(fig, out / "distance_vs_log_steps",
            "Distance from initialisation |w_t - w_0| (all parameters, L2) against optimizer steps on a log "
            "axis: mean over seeds (band: range over seeds); dashed: d = a + b ln t fitted per run from step "
            f"{fit_t_min:g} to the first lr decay (mean of the seeds' fits; mean R^2 in the legend).", runs=ok)
plt.show()

# %%
# learning curves of the main steps of the recipe (all variants are in the tables)
main = [v for v in [reference, "lb", "lb_sqrt_gbn", "lb_ra", "lb_sqrt_gbn_ra"] if v in order]
curves = history[history["variant"].isin(main)]
fig, axes = figure_grid(2, width=5.0, height=3.6)
learning_curves(axes[0], curves, "train_loss", hue="variant", palette=colors)
learning_curves(axes[1], curves, "test_acc", hue="variant", log_y=False, palette=colors)
save_figure(fig, out / "learning_curves",
            "Full-train loss and test accuracy against optimizer steps for SB, LB, LB + sqrt + ghost BN, LB + "
            "regime adaptation and the whole recipe; mean and 95% interval over seeds.", runs=ok)
plt.show()

# %%
# the numbers the report cites
t = table.set_index("variant")
for v in order:
    r = t.loc[v]
    print(f"{v:16s} test_acc {r.test_acc_mean:.4f} +- {r.test_acc_std:.4f}  gap {r.gap_acc_mean:+.4f}  "
          f"train_loss {r.train_loss_mean:.4f}  steps {r.steps_mean:.0f}  (n={r.n}, diverged {r.n_diverged})")
