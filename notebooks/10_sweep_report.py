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
# A sweep of a training notebook of one's own (its runs written by `bsresearch.runwriter.RunWriter` or the
# Hugging Face / Lightning callback) is drawn from what those runs record: every final metric they report,
# B_simple and the sharpness (their last values along training) against batch size and the learning rate
# where the grid varies them, and the learning curves of what they logged.
#
# An accuracy's t interval is clipped to [0, 1] (with 2 seeds it can reach past 1); on a log axis the
# figures draw the geometric mean over seeds and the t interval of the logs, which stays on the axis. The
# captions say which.
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
from bsresearch.plots import (
    figure_grid,
    learning_curves,
    metric_vs_batch,
    metric_vs_lr,
    save_figure,
    steps_to_target_plot,
)
from bsresearch.plots.sweeps import BOUNDED_METRICS

runs_path, out, runs = results.start_report(sweep, runs_dir, out_dir)
results.require_finished(runs, sweep)   # none finished: one line saying why, not an error in a later cell
ok = results.finished(runs)
own = results.is_own_training(ok)       # a training notebook of one's own: its parameters and what it logged
grid = results.sweep_axes(sweep, runs_path)
x = "batch_size" if "batch_size" in ok else next(a for a in grid if a not in ("seed", "variant"))
axes_of_sweep = [a for a in grid if a not in (x, "seed")]
hue = axes_of_sweep[0] if len(axes_of_sweep) == 1 else None     # e.g. the lr, when the grid varies it
lr = next((a for a in ("lr", "learning_rate") if a in axes_of_sweep), None)
unit = None if own else results.loss_unit(ok)                   # e.g. nats, nats per token, mean squared error
accuracy = not own and results.accuracy_is_the_metric(ok)       # a classifier's; else the loss is the metric
history = results.load_history(ok, [x, *axes_of_sweep, "seed"])
if own:   # measured along training: the last value each run recorded, where its metrics do not have it
    ok = results.with_last_values(ok, history, ["b_simple_ema", "b_simple", "sharpness", "sharpness_limit",
                                                "preconditioned_sharpness", "batch_sharpness"])
print("grid axes:", grid, "| budget:", results.budget_description(ok), "| loss:", unit or "as the notebook logs it")


def numeric(column: str) -> bool:
    return column in ok and pd.api.types.is_numeric_dtype(ok[column]) and bool(ok[column].notna().any())


clipped = " Accuracy intervals are clipped to [0, 1]."

# %%
# final metrics against batch size: accuracy where the runs report it, else the loss in its unit
if own:
    final = [m for m in ("test_acc", "eval_accuracy", "accuracy", "test_loss", "eval_loss", "train_loss", "loss")
             if numeric(m)]
else:
    final = ["test_acc", "train_acc", "gap_acc"] if accuracy else ["test_loss", "train_loss", "gap_loss"]
table_runs = ok if own else results.generalization_gap(ok)
if final:
    fig, axes = figure_grid(len(final))
    logged = []   # a loss is positive: on a log axis, where its interval cannot reach below 0
    for ax, metric in zip(axes, final):
        log_y = metric.endswith("loss") and not metric.startswith("gap") and bool((table_runs[metric] > 0).all())
        logged += [metric] * log_y
        metric_vs_batch(ax, table_runs, metric, hue=hue, unit=unit, x=x, log_y=log_y)
    what = ", ".join(final) if own else "accuracy" if accuracy else f"loss ({unit})"
    save_figure(fig, out / "metrics_vs_batch",
                (f"Final {what} against batch size" if own else
                 f"Final test {what}, train {what} and their gap against batch size")
                + "; mean and 95% t interval over seeds, seeds as grey points"
                + (f"; on log axes ({', '.join(logged)}) the geometric mean and the t interval of the logs" if logged
                   else "") + "." + (clipped if any(m in BOUNDED_METRICS for m in final) else ""), runs=ok)
    plt.show()
else:
    print("the runs report no final metric (metrics.json) that this report knows")

# %%
# measurements: at the end of training (the run template's `measurements`: noise scale, Hessian eigenvalue and
# trace, Keskar's phi, sharpness), or along training (a notebook of one's own: B_simple and the sharpness, their
# last values), without standard errors and diagnostics
noise_unit = str(history["unit"].dropna().iloc[0]) if "unit" in history and history["unit"].notna().any() \
    else None   # B_simple's unit where the runs say it (examples, or tokens for a token-level loss)
kinds = ("noise_b_simple", "noise_b_noise", "hessian_top_eigenvalue", "hessian_trace", "keskar_phi_", "sharpness_",
         "m_sharpness_")
if own:   # B_simple's moving average (else its last estimate); the sharpness with its stability limit
    measured = [next((c for c in ("b_simple_ema", "b_simple") if numeric(c)), None), "sharpness",
                "sharpness_limit" if numeric("sharpness") else None]
    measured = [c for c in measured if c and numeric(c)]
else:
    measured = [c for c in ok.columns if c.startswith(kinds) and not c.endswith(("_std_error", "_residual",
                                                                                 "_converged")) and numeric(c)]
if measured:
    panels = measured + ([m for m in measured if m != "sharpness_limit"] if own and lr else [])
    fig, axes = figure_grid(len(panels))
    logged = []
    for k, (ax, metric) in enumerate(zip(axes, panels)):
        log_y = bool((ok[metric].dropna() > 0).all())
        logged += [metric] * log_y
        if k < len(measured):
            metric_vs_batch(ax, ok, metric, hue=hue, x=x, log_y=log_y, unit=noise_unit)
        else:   # against the learning rate, one line per batch size
            metric_vs_lr(ax, ok, metric, hue=x, x=lr, log_y=log_y, unit=noise_unit)
    save_figure(fig, out / "measurements_vs_batch",
                ("Measurements along training, each run's last value (" if own else
                 "Measurements of the final weights (") + ", ".join(measured) + ") against batch size"
                + (" and against the learning rate" if own and lr else "")
                + "; mean and 95% t interval over seeds"
                + (f"; on log axes ({', '.join(dict.fromkeys(logged))}) the geometric mean and the t interval of the "
                   "logs" if logged else "") + ".", runs=ok)
    plt.show()
else:
    print("no measurements in this sweep")

# %%
# learning curves: mean over seeds, one line per batch size
if own:
    along = "examples" if "examples" in history else "step"
    curves = [c for c in ("train_loss", "loss", "test_loss", "eval_loss", "test_acc", "eval_accuracy")
              if c in history and history[c].notna().any()][:2]
else:
    along, curves = "step", ["train_loss", "test_acc" if accuracy else "test_loss"]
if curves and len(history):
    fig, axes = figure_grid(len(curves))
    for ax, curve in zip(axes, curves):
        log_y = curve not in BOUNDED_METRICS and bool((history[curve].dropna() > 0).all())
        learning_curves(ax, history, curve, x=along, hue=x, log_y=log_y, geometric=log_y, unit=unit)
    save_figure(fig, out / "learning_curves",
                f"{' and '.join(curves)} against {'examples seen' if along == 'examples' else 'optimizer steps'}, per "
                "batch size; mean and 95% t interval over seeds (and learning rates, if the sweep varied them); on log "
                "axes the geometric mean and the t interval of the logs." +
                (clipped if any(c in BOUNDED_METRICS for c in curves) else ""), runs=ok)
    plt.show()

# %%
# with the lr tuned per batch size on a target budget: steps to the target, and the critical batch
if not own and "lr" in axes_of_sweep and set(ok["budget"]) == {"target"} and ok["batch_size"].nunique() >= 2:
    best = stats.best_lr(ok, "steps_to_target", by="batch_size")
    display(best)
    fit = results.critical_batch(best) if best["steps_to_target"].notna().sum() >= 2 else None
    fig, axes = figure_grid(2)
    steps_to_target_plot(axes[0], best, fit=fit, label="best lr per batch size")
    metric_vs_lr(axes[1], ok, "steps_to_target", log_y=True)
    save_figure(fig, out / "steps_to_target",
                "Steps to the target train loss against batch size at the best lr of each batch size, "
                "with the fit S = S_min (1 + B_crit/B); right: against the lr (geometric mean over seeds and the t "
                "interval of the logs).", runs=ok)
    plt.show()
    if fit is not None:
        print(f"B_crit = {fit.b_crit:.4g} ({fit.confidence:.0%} interval {fit.b_crit_interval[0]:.4g}"
              f"-{fit.b_crit_interval[1]:.4g}), S_min = {fit.s_min:.4g}")

# %%
# the summary table: mean, std and 95% t interval over seeds per batch size (and the varied axis)
bits = [c for c in ok.columns if c.startswith("test_bits_per_")]   # a language model's, when its data says
metrics = [m for m in dict.fromkeys([*final, "test_acc", "train_acc", "gap_acc", "test_loss", "train_loss", *bits,
                                     "steps", "train_seconds", *measured])
           if m in table_runs and pd.api.types.is_numeric_dtype(table_runs[m]) and table_runs[m].notna().any()]
table = stats.summarize(table_runs, [x] + ([hue] if hue else []), metrics)
table.to_csv(out / "summary.csv", index=False)
shown = [x] + ([hue] if hue else []) + ["n"] + [f"{m}_mean" for m in metrics]
lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
for _, row in table[shown].iterrows():
    lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |")
(out / "summary.md").write_text(results.provenance_caption(ok) + "\n\n" + "\n".join(lines) + "\n")
table[shown]
