# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 23 · Steps to a target against batch size: Shallue et al. (2019) and McCandlish et al. (2018)
#
# **Claims.** Shallue et al.: with the learning rate re-tuned for every batch size, the number of steps S
# needed to reach a fixed goal falls with the batch size B in three regimes: *perfect scaling* (doubling B
# halves S), *diminishing returns*, and *maximal data parallelism* (a larger B buys no fewer steps).
# McCandlish et al.: S = S_min (1 + B_crit/B), equivalently E = E_min (1 + B/B_crit) for the examples
# E = S B, and the simple noise scale B_simple = tr(Sigma)/|G|^2 predicts B_crit within about an order of
# magnitude (their Table 1, B_crit / B_simple: MNIST 200 / 900, SVHN 500 / 4000, CIFAR-10 900 / 2000).
#
# **Here** (`experiments/steps_to_target.yaml`, which states why each setting): MNIST-1D, cnn1d, plain SGD
# (momentum 0), constant lr tuned per batch size on a log2 grid, S = steps until the full-train loss is at
# most the target, batch 2 to 4000 (full batch). B_simple (exact, per-example, over the whole training
# set) and B_noise (with the Hessian) are measured at checkpoints of one run
# (`experiments/steps_to_target_noise.yaml`) and at the weights where every batch size reached the target.
#
# Regimes are read from the fitted curve: its scaling exponent -dlog S/dlog B = B_crit/(B + B_crit) is 1 at
# small B and 0 at large B; the boundaries are where it equals `perfect_exponent` (0.8: B = B_crit/4) and
# `maximal_exponent` (0.2: B = 4 B_crit). The measured exponent between neighbouring batch sizes is reported
# next to it, as a check that does not depend on the fit.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "steps_to_target"             # the steps-to-target sweep: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                     # root folder of run directories (relative: to the project)
out_dir: str = "reports/steps_to_target"     # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = None            # the spec file, for the record
noise_sweep: str = "steps_to_target_noise" # B_simple / B_noise at checkpoints of one run ("" to skip)
confidence: float = 0.95                   # level of every interval (t-intervals over seeds, fit intervals)
perfect_exponent: float = 0.8              # regime boundary: fitted scaling exponent above this is perfect scaling
maximal_exponent: float = 0.2              # ... and below this, maximal data parallelism
measure_at_target: bool = True             # B_simple at each best-lr run's final weights (needs torch, ~2-4 s each)

# %%

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from bsresearch import results, stats
from bsresearch.findings import steps_to_target as stt
from bsresearch.findings.steps_to_target import (
    examples_vs_batch,
    noise_at_target_vs_batch,
    noise_vs_training,
    regime_legend_text,
    steps_vs_batch,
    steps_vs_lr,
    tuned_lr_vs_batch,
)
from bsresearch.paths import project_path, require_sweep
from bsresearch.plots import figure_grid, learning_curves, save_figure

runs_dir, out = project_path(runs_dir), project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)
require_sweep(sweep, runs_dir)
runs = results.load(sweep, runs_root=runs_dir)
print(f"{len(runs)} runs: " + ", ".join(f"{s} {n}" for s, n in runs["state"].value_counts().items()))
tried = results.finished(runs, include_diverged=True)   # a diverged run is a data point (no steps)
missing = runs[~runs["state"].isin(["ok", "diverged"])]
if len(missing):
    print("NOT finished (left out; rerun the sweep):")
    display(missing[["batch_size", "lr", "seed", "state", "error"]])
targets = tried["target_loss"].unique()
assert len(targets) == 1 and set(tried["budget"]) == {"target"}, "one target-loss budget expected"
target = float(targets[0])
print(f"target: full-train loss <= {target:g}; batch sizes {sorted(tried.batch_size.unique())}; "
      f"seeds {sorted(tried.seed.unique())}; {results.budget_description(tried)}")

# %% [markdown]
# ## The tuned lr, and steps to the target at it
#
# Per batch size the best lr is the one with the fewest mean steps over seeds; a run that diverged or hit
# its step cap counts as the worst (`stats.best_lr`). `interior` says whether the best lr lies strictly
# inside the lrs tried; if not, the spec's grid must be extended for that batch size.

# %%
tuned = stt.tuned_table(tried, confidence=confidence)
per_seed = stt.at_best_lr(tried, tuned)
edge = tuned[~tuned["interior"]]
print("best lr interior for every batch size" if edge.empty else
      f"WARNING: best lr on the grid's edge for batch sizes {edge['batch_size'].tolist()}: extend the grid")
steps_resolution = (tried.groupby("batch_size")["eval_every"].first() / tuned.set_index("batch_size")["steps_mean"])
print("steps-to-target resolution (eval_every / steps):",
      ", ".join(f"B {b}: {r:.1%}" for b, r in steps_resolution.items()))

# every (batch size, lr): how many seeds reached the target, mean steps, the states
by_lr = stats.summarize(tried, ["batch_size", "lr"], ["steps_to_target"], confidence)
by_cell = tried.groupby(["batch_size", "lr"])
states = by_cell["state"].agg(lambda s: ", ".join(f"{k} {v}" for k, v in s.value_counts().items()))
reached = by_cell["steps_to_target"].agg(lambda s: int(pd.to_numeric(s, errors="coerce").notna().sum()))
by_lr = by_lr.merge(states.rename("states").reset_index(), on=["batch_size", "lr"]).merge(
    reached.rename("n_reached").reset_index(), on=["batch_size", "lr"])
by_lr.to_csv(out / "steps_by_lr.csv", index=False)
tuned

# %% [markdown]
# ## The critical batch size: S = S_min (1 + B_crit/B)
#
# Fitted in log space (`bsresearch.measure.critical`) to the runs at the best lr: every seed's point
# ("all seeds", the one drawn), the seed means, and each seed alone. Intervals are Student-t on the log
# parameters from the fit's residuals. The best lr is picked on the same runs, which biases its steps
# slightly low (the minimum of noisy means).

# %%
fits = stt.critical_batch_fits(per_seed, confidence=confidence)
fit = results.critical_batch(per_seed, confidence=confidence)      # = the "all seeds" row, for the figures
lr_fit = stt.fit_tuned_lr(tuned, confidence=confidence) if tuned["interior"].sum() >= 2 else None
low, high = stt.regime_boundaries(fit.b_crit, perfect_exponent, maximal_exponent)
tuned["regime"] = stt.regime_of(tuned["batch_size"], fit.b_crit, perfect_exponent, maximal_exponent)
exponents = stt.local_exponents(tuned, b_crit=fit.b_crit)
tuned.to_csv(out / "tuned_lr.csv", index=False)
exponents.to_csv(out / "local_exponents.csv", index=False)
lr_rows = [] if lr_fit is None else [{
    "fit": "tuned lr: eps_max/(1 + B_lr/B)", "n_points": lr_fit.n_points, "b_crit": lr_fit.b_lr,
    "b_crit_low": lr_fit.b_lr_interval[0], "b_crit_high": lr_fit.b_lr_interval[1],
    "rms_log_residual": lr_fit.rms_log_residual, "confidence": confidence, "eps_max": lr_fit.eps_max,
    "eps_max_low": lr_fit.eps_max_interval[0], "eps_max_high": lr_fit.eps_max_interval[1]}]
fit_table = pd.concat([fits, pd.DataFrame(lr_rows)], ignore_index=True)
fit_table.to_csv(out / "critical_batch_fit.csv", index=False)
print(f"B_crit = {fit.b_crit:.3g} ({confidence:.0%} interval "
      f"{fit.b_crit_interval[0]:.3g}-{fit.b_crit_interval[1]:.3g}), "
      f"S_min = {fit.s_min:.4g} ({fit.s_min_interval[0]:.4g}-{fit.s_min_interval[1]:.4g}), "
      f"E_min = {fit.e_min:.4g} examples; rms log residual {fit.rms_log_residual:.3f}")
print(f"regimes of the fitted curve: perfect scaling B <= {low:.3g}, diminishing returns {low:.3g} < B < {high:.3g}, "
      f"maximal data parallelism B >= {high:.3g}")
display(fit_table)
exponents

# %%
fig, axes = figure_grid(2, width=5.2, height=4.0)
steps_vs_batch(axes[0], per_seed, tuned, fit, perfect=perfect_exponent, maximal=maximal_exponent)
examples_vs_batch(axes[1], per_seed, tuned, fit, perfect=perfect_exponent, maximal=maximal_exponent)
save_figure(fig, out / "steps_to_target",
            f"Left: steps to full-train loss <= {target:g} against batch size, at each batch size's best lr "
            f"(plain SGD, constant lr); grey: each seed, blue: mean over seeds +- one standard deviation "
            f"({'-'.join(map(str, sorted(set(per_seed.groupby('batch_size').size()))))} seeds per batch size; "
            f"t-intervals in tuned_lr.csv); line: S = S_min (1 + B_crit/B) fitted to every seed's point, "
            f"B_crit = {fit.b_crit:.3g} (dotted; {confidence:.0%} interval "
            f"{fit.b_crit_interval[0]:.3g}-{fit.b_crit_interval[1]:.3g}, dark bar at the bottom), "
            f"S_min = {fit.s_min:.4g} (dashed). Right: examples to the target E = S B with E = E_min (1 + B/B_crit), "
            f"E_min = {fit.e_min:.4g} (dashed). " + regime_legend_text(perfect_exponent, maximal_exponent),
            runs=tried)
plt.show()

# %%
fig, axes = figure_grid(2, width=5.2, height=4.0)
tuned_lr_vs_batch(axes[0], tuned, tried, lr_fit=lr_fit)
steps_vs_lr(axes[1], tried)
save_figure(fig, out / "tuned_lr",
            f"Left: the best constant lr per batch size (fewest mean steps to train loss <= {target:g}; filled: "
            f"interior to the lrs tried, open: on the grid's edge), every lr tried (grey ticks)"
            + ("" if lr_fit is None else
               f", and eps(B) = eps_max/(1 + B_lr/B) fitted to the interior best lrs: eps_max = {lr_fit.eps_max:.2g}, "
               f"B_lr = {lr_fit.b_lr:.3g} (interval {lr_fit.b_lr_interval[0]:.3g}-{lr_fit.b_lr_interval[1]:.3g}; "
               f"the lrs are on a factor-2 grid)") + ". Right: steps to the target against the lr per batch size, mean "
            "over the seeds (x: some seed diverged or hit the step cap, drawn at the cap).", runs=tried)
plt.show()

# %%
# learning curves at the best lr: full-train loss against steps, mean over seeds, one line per batch size
history = results.load_history(per_seed)
fig, axes = figure_grid(2, width=5.2, height=4.0)
learning_curves(axes[0], history, "train_loss", x="step", errorbar=None, palette="viridis")
learning_curves(axes[1], history, "train_loss", x="examples", errorbar=None, palette="viridis")
for ax in axes:
    ax.axhline(target, color="0.3", linestyle=":", linewidth=1)
    ax.legend(title="batch size", fontsize=6, title_fontsize=7, ncols=2)
save_figure(fig, out / "learning_curves_best_lr",
            f"Full-train loss against steps (left) and examples (right) at each batch size's best lr, mean "
            f"over seeds; dotted: the target {target:g}. Runs stop at the first evaluation at or below it.",
            runs=per_seed)
plt.show()

# %% [markdown]
# ## The gradient noise scale along training, against B_crit
#
# Runs with the same seed, batch size and constant lr follow one trajectory whatever their step budget, so
# the noise sweep's fixed-step runs end at checkpoints of one run; each measures exact B_simple over the
# 4000 training examples (per-example gradients, |G|^2 of the full training set: `unbiased=False`) and
# B_noise = tr(H Sigma)/(G^T H G) (Hutchinson, 10 probes). The check below compares their train loss with
# the target-budget run of the same point at the steps both evaluated.

# %%
from bsresearch.config import ConfigError

noise = pd.DataFrame()
try:
    noise_runs = results.load(noise_sweep, runs_root=runs_dir) if noise_sweep else None
except ConfigError as exc:   # that sweep has not been run
    print(f"no noise-scale checkpoints: {exc}")
    noise_runs = None
if noise_runs is not None:
    noise_states = noise_runs["state"].value_counts().items()
    print(f"{len(noise_runs)} noise runs: " + ", ".join(f"{s} {n}" for s, n in noise_states))
    noise = stt.noise_checkpoints(noise_runs)
if len(noise):
    point = noise[["batch_size", "lr"]].drop_duplicates()
    assert len(point) == 1, "one batch size and lr expected in the noise sweep"
    b0, lr0 = point.iloc[0]
    same = tried[(tried["batch_size"] == b0) & (tried["lr"] == lr0)]
    check = noise.merge(results.load_history(same)[["seed", "step", "train_loss"]], on=["seed", "step"],
                        suffixes=("", "_target_run"))
    print(f"noise runs: batch {b0:g}, lr {lr0:g} (best lr of that batch size: "
          f"{tuned.set_index('batch_size').loc[b0, 'lr']:g}); same-trajectory check at {len(check)} steps: "
          f"max |train loss difference| = {np.abs(check.train_loss - check.train_loss_target_run).max():.2g}")
    at_target = stt.value_at_loss(noise, target, "b_simple").merge(
        stt.value_at_loss(noise, target, "b_noise")[["seed", "b_noise"]], on="seed")
    noise.to_csv(out / "noise_scale_checkpoints.csv", index=False)
    display(noise)
    display(at_target)

# %%
# B_simple at the weights where each batch size reached the target (the best-lr runs' final checkpoints)
at_weights = pd.DataFrame()
if measure_at_target:
    import torch

    from bsresearch.data import dataset_for
    from bsresearch.measure.noise import gradient_noise_scale
    from bsresearch.train import load_trained_model
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"   # where the runs were trained does not matter
    rows, data = [], None
    for _, run in per_seed.iterrows():
        model, cfg = load_trained_model(run["run_dir"], device=device)
        data = data or dataset_for(cfg, device)
        ns = gradient_noise_scale(model, data.x_train, data.y_train, unbiased=False)
        rows.append({"batch_size": run["batch_size"], "lr": run["lr"], "seed": run["seed"],
                     "step": run["steps"], "train_loss": run["train_loss"], "b_simple": ns.b_simple,
                     "trace_cov": ns.trace_cov, "grad_sq_norm": ns.grad_sq_norm})
    at_weights = pd.DataFrame(rows)
    at_weights.to_csv(out / "b_simple_at_target.csv", index=False)
    display(stats.summarize(at_weights, "batch_size", ["b_simple", "train_loss"], confidence))

# %%
if len(noise):
    n_panels = 3 if len(at_weights) else 2
    fig, axes = figure_grid(n_panels, width=4.6, height=3.8)
    noise_vs_training(axes[0], noise, fit, x="step")
    noise_vs_training(axes[1], noise, fit, x="train_loss", target_loss=target)
    axes[0].set_title(f"batch {b0:g}, lr {lr0:g}", fontsize=9)
    if len(at_weights):
        noise_at_target_vs_batch(axes[2], at_weights, fit)
    save_figure(fig, out / "noise_scale",
                f"Exact B_simple = tr(Sigma)/|G|^2 over the {int(tried['n_train'].iloc[0])} training examples "
                f"(blue) and B_noise = "
                f"tr(H Sigma)/(G^T H G) (red; 10 Hutchinson probes, bars: standard error) at checkpoints of the "
                f"batch-{b0:g}, lr-{lr0:g} run, each seed a line (solid, dashed), against steps (left) and the "
                f"full-train loss (middle, dotted: the target {target:g}); B_noise <= 0 (negative curvature along "
                f"the gradient, steps {sorted(noise.loc[noise.b_noise <= 0, 'step'].unique().tolist())}) is not "
                f"drawn. Dashed line and grey band: B_crit = {fit.b_crit:.3g} from the steps-to-target fit and its "
                f"{confidence:.0%} interval."
                + (" Right: exact B_simple at the weights where each batch size first reached the target (its "
                   "best lr; each seed, and the geometric mean)." if len(at_weights) else ""), runs=tried)
    plt.show()
elif len(at_weights):   # no noise sweep (analysis_parameters: {noise_sweep: ""}): B_simple at the target only
    fig, ax = plt.subplots(figsize=(4.6, 3.8), layout="constrained")
    noise_at_target_vs_batch(ax, at_weights, fit)
    save_figure(fig, out / "noise_scale",
                f"Exact B_simple = tr(Sigma)/|G|^2 over the {int(tried['n_train'].iloc[0])} training examples at "
                f"the weights where each batch size first reached the target (its best lr; each seed, and the "
                f"geometric mean). Dashed line and grey band: B_crit = {fit.b_crit:.3g} from the steps-to-target "
                f"fit and its {confidence:.0%} interval.", runs=tried)
    plt.show()

# %% [markdown]
# ## Summary: B_crit against the noise scale (McCandlish et al.'s comparison)

# %%
rows = [{"quantity": "B_crit (steps-to-target fit, all seeds)", "value": fit.b_crit,
         "low": fit.b_crit_interval[0], "high": fit.b_crit_interval[1]}]
for _, r in fits.iterrows():
    if r["fit"] != "all seeds":
        rows.append({"quantity": f"B_crit ({r['fit']})", "value": r["b_crit"], "low": r["b_crit_low"],
                     "high": r["b_crit_high"]})
if lr_fit is not None:
    rows.append({"quantity": "B_lr (tuned-lr fit)", "value": lr_fit.b_lr, "low": lr_fit.b_lr_interval[0],
                 "high": lr_fit.b_lr_interval[1]})
def spread(values):
    values = pd.Series(values, dtype=float).dropna()
    return values.mean(), values.min(), values.max()
if len(noise):
    for name, column in (("B_simple", "b_simple"), ("B_noise", "b_noise")):
        mean, lo, hi = spread(at_target[column])
        rows.append({"quantity": f"{name} at the target loss (batch {b0:g} run, interpolated; "
                                 "mean, min, max over seeds)",
                     "value": mean, "low": lo, "high": hi})
        positive = noise.loc[noise[column] > 0, column]
        mean, lo, hi = spread(positive)
        rows.append({"quantity": f"{name} along training (checkpoints where it is > 0, {len(positive)} of "
                     f"{len(noise)}: mean, min, max)", "value": mean, "low": lo, "high": hi})
if len(at_weights):
    mean, lo, hi = spread(at_weights["b_simple"])
    rows.append({"quantity": "B_simple at the target weights of every best-lr run (mean, min, max)",
                 "value": mean, "low": lo, "high": hi})
    # |G|^2 at one iterate fluctuates far more than tr(Sigma) (oscillations along sharp directions), so
    # McCandlish et al. average numerator and denominator before the ratio: here over all those runs
    pooled = at_weights["trace_cov"].mean() / at_weights["grad_sq_norm"].mean()
    rows.append({"quantity": "B_simple at the target weights, ratio of means (mean tr(Sigma) / mean |G|^2)",
                 "value": pooled, "low": np.nan, "high": np.nan})
comparison = pd.DataFrame(rows)
comparison["ratio_to_b_crit"] = comparison["value"] / fit.b_crit
comparison.to_csv(out / "noise_vs_critical.csv", index=False)
published = pd.DataFrame({"task": ["MNIST", "SVHN", "CIFAR-10", "ImageNet"], "b_crit": [200, 500, 900, 15000],
                          "b_simple": [900, 4000, 2000, 30000]}).assign(ratio=lambda d: d.b_simple / d.b_crit)
published.to_csv(out / "mccandlish_table1.csv", index=False)
display(published)
comparison

# %%
# a short text summary next to the figures
lines = [results.provenance_caption(tried), "",
         f"Target: full-train loss <= {target:g}. "
         f"Best lr interior for every batch size: {bool(tuned['interior'].all())}.",
         f"B_crit = {fit.b_crit:.3g} ({confidence:.0%} interval "
         f"{fit.b_crit_interval[0]:.3g}-{fit.b_crit_interval[1]:.3g}); "
         f"S_min = {fit.s_min:.4g}; E_min = {fit.e_min:.4g} examples "
         f"({fit.e_min / tried['n_train'].iloc[0]:.2g} epochs).",
         f"Regimes (fitted exponent {perfect_exponent:g} / {maximal_exponent:g}): perfect scaling B <= {low:.3g}, "
         f"diminishing returns up to {high:.3g}, maximal data parallelism beyond.", "",
         "| batch size | best lr | interior | steps (mean +- std over seeds) | examples (mean) | regime (fit) |",
         "|---|---|---|---|---|---|---|"]
for _, r in tuned.iterrows():
    lines.append(f"| {r.batch_size:g} | {r.lr:g} | {r.interior} | "
                 f"{r.steps_mean:.4g} +- {r.steps_std:.2g} (n {r.n_reached}) "
                 f"| {r.examples_mean:.4g} | {r.regime} |")
lines += ["", "| quantity | value | low | high | / B_crit |", "|---|---|---|---|---|"]
for _, r in comparison.iterrows():
    lines.append(f"| {r.quantity} | {r.value:.3g} | {r.low:.3g} | {r.high:.3g} | {r.ratio_to_b_crit:.2g} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
