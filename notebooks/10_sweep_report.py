# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Sweep report
#
# Reads a sweep's run directories into a table (one row per run), and draws the figures a report cites:
# the final metrics against batch size (mean and 95% t interval over seeds), any measurement taken at the
# end (sharpness, Hessian eigenvalue), learning curves, and, when the learning rate was tuned per batch
# size on a target budget, steps to the target with the critical-batch fit. Losses are in the runs' own
# unit (nats, nats per token, mean squared error: what the model's output and targets make). Each figure is
# saved as PNG and PDF with a caption file (sweep, commit, budget kind); the summary table as CSV and Markdown.
#
# `bsresearch report experiments/<spec>.yaml` executes this notebook into `reports/<name>/`.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "demo"                 # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"              # root folder of run directories (relative: to the project)
out_dir: str = "reports/demo"       # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = None     # the spec file, for the record

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from bsresearch import results, stats
from bsresearch.paths import project_path
from bsresearch.plots import (
    figure_grid,
    learning_curves,
    metric_vs_batch,
    metric_vs_lr,
    save_figure,
    steps_to_target_plot,
)

runs_dir, out = project_path(runs_dir), project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)
results.sweep_dir(sweep, runs_dir)
runs = results.load(sweep, runs_root=runs_dir)
ok = results.finished(runs)
print(f"{len(runs)} runs: " + ", ".join(f"{s} {n}" for s, n in runs["state"].value_counts().items()))
axes_of_sweep = [a for a in results.sweep_axes(sweep, runs_dir) if a not in ("batch_size", "seed")]
hue = axes_of_sweep[0] if len(axes_of_sweep) == 1 else None   # e.g. lr, when the grid varies it
unit = results.loss_unit(ok)                                    # e.g. nats, nats per token, mean squared error
accuracy = results.accuracy_is_the_metric(ok)                   # a classifier's; else the loss is the metric
print("grid axes:", results.sweep_axes(sweep, runs_dir), "| budget:", results.budget_description(ok),
      "| loss:", unit)

# %%
# final metrics against batch size: accuracy where the runs report it, else the loss in its unit
final = ["test_acc", "train_acc", "gap_acc"] if accuracy else ["test_loss", "train_loss", "gap_loss"]
fig, axes = figure_grid(3)
for ax, metric in zip(axes, final):
    metric_vs_batch(ax, results.generalization_gap(ok), metric, hue=hue, unit=unit)
what = "accuracy" if accuracy else f"loss ({unit})"
save_figure(fig, out / "metrics_vs_batch",
            f"Final test {what}, train {what} and their gap against batch size; mean and 95% t "
            "interval over seeds, seeds as grey points.", runs=ok)
plt.show()

# %%
# measurements taken at the end of training, if the sweep asked for any: every number they record (noise scale,
# Hessian eigenvalue and trace, Keskar's phi, sharpness), without standard errors and diagnostics
kinds = ("noise_b_simple", "noise_b_noise", "hessian_top_eigenvalue", "hessian_trace", "keskar_phi_", "sharpness_",
         "m_sharpness_")
measured = [c for c in ok.columns if c.startswith(kinds) and not c.endswith(("_std_error", "_residual", "_converged"))
            and pd.api.types.is_numeric_dtype(ok[c]) and ok[c].notna().any()]
if measured:
    fig, axes = figure_grid(len(measured))
    for ax, metric in zip(axes, measured):
        metric_vs_batch(ax, ok, metric, hue=hue)
        if (ok[metric].dropna() > 0).all():
            ax.set_yscale("log")
    save_figure(fig, out / "measurements_vs_batch",
                "Measurements of the final weights against batch size (" + ", ".join(measured) +
                "); mean and 95% t interval over seeds.", runs=ok)
    plt.show()
else:
    print("no measurements in this sweep")

# %%
# learning curves: mean over seeds, one line per batch size
history = results.load_history(ok)
fig, axes = figure_grid(2)
learning_curves(axes[0], history, "train_loss", unit=unit)
learning_curves(axes[1], history, "test_acc" if accuracy else "test_loss", log_y=not accuracy, unit=unit)
save_figure(fig, out / "learning_curves",
            f"Full-train loss ({unit}) and test {'accuracy' if accuracy else 'loss'} against optimizer steps, per "
            f"batch size; mean and 95% t interval over seeds (and learning rates, if the sweep varied them).", runs=ok)
plt.show()

# %%
# with the lr tuned per batch size on a target budget: steps to the target, and the critical batch
if "lr" in axes_of_sweep and set(ok["budget"]) == {"target"} and ok["batch_size"].nunique() >= 2:
    best = stats.best_lr(ok, "steps_to_target", by="batch_size")
    display(best)
    fit = results.critical_batch(best) if best["steps_to_target"].notna().sum() >= 2 else None
    fig, axes = figure_grid(2)
    steps_to_target_plot(axes[0], best, fit=fit, label="best lr per batch size")
    metric_vs_lr(axes[1], ok, "steps_to_target")
    axes[1].set_yscale("log")
    save_figure(fig, out / "steps_to_target",
                "Steps to the target train loss against batch size at the best lr of each batch size, "
                "with the fit S = S_min (1 + B_crit/B); right: against the lr.", runs=ok)
    plt.show()
    if fit is not None:
        print(f"B_crit = {fit.b_crit:.4g} ({fit.confidence:.0%} interval {fit.b_crit_interval[0]:.4g}"
              f"-{fit.b_crit_interval[1]:.4g}), S_min = {fit.s_min:.4g}")

# %%
# the summary table: mean, std and 95% t interval over seeds per batch size (and the varied axis)
bits = [c for c in ok.columns if c.startswith("test_bits_per_")]   # a language model's, when its data says
metrics = [m for m in ["test_acc", "train_acc", "gap_acc", "test_loss", "train_loss", *bits, "steps", "train_seconds",
                       *measured] if m in results.generalization_gap(ok)]
table = stats.summarize(results.generalization_gap(ok), ["batch_size"] + ([hue] if hue else []), metrics)
table.to_csv(out / "summary.csv", index=False)
shown = ["batch_size"] + ([hue] if hue else []) + ["n"] + [f"{m}_mean" for m in metrics]
lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
for _, row in table[shown].iterrows():
    lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
(out / "summary.md").write_text(results.provenance_caption(ok) + "\n\n" + "\n".join(lines) + "\n")
table[shown]
