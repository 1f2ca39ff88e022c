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
# **Pre-registered tests** (docs/protocols.md#steps-to-target, written before the sweeps that count), printed
# first whatever they say:
# 1. B_crit from S = S_min (1 + B_crit/B) fitted to every (batch size, seed) point at the tuned lr, with its 95%
#    interval: *reproduced* if the interval lies within [4 B_min, B_max/4], *partly* if only B_crit does, *not
#    reproduced* if B_crit does not (B_min, B_max: the smallest and largest batch sizes in the fit). Validity:
#    every best lr interior, at least 6 batch sizes in the fit.
# 2. r = B_simple,target / B_crit, B_simple,target = mean tr(Sigma) / mean |G|^2 over the fit's runs, measured
#    exactly at the weights where each first reached the target; interval from B_crit's: *reproduced* if r and
#    its interval lie within [1/10, 10], *partly* if r does, *not reproduced* if not.
#
# **Two stages** (the protocol's rule): the best lr of a batch size is the one with the fewest mean steps over
# the selection seeds 1 and 2 (this spec's sweep; a diverged or capped run counts as the worst); seeds 3, 4, 5
# are run at that lr only (the seeds sweep, `<spec>_seeds.yaml`). The fit uses all five; a fit on seeds 3-5
# alone, free of the selection's optimism, is a secondary. A run at the best lr that did not reach the target
# is left out of the fit and counted; a batch size where fewer than 3 seeds reached it is left out.
#
# Steps to the target are read at the first evaluation at or below it (no interpolation); B_simple at the
# target is measured at the weights of that evaluation. Interpolated values appear only as labelled secondaries.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "steps_to_target"             # the selection sweep (seeds 1, 2, every lr): RUNS_DIR/SWEEP/
runs_dir: str = "runs"                     # root folder of run directories (relative: to the project)
out_dir: str = "reports/steps_to_target"   # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = None            # the spec file, for the record
seeds_sweep: Optional[str] = None          # seeds 3-5 at the chosen lr; None: SWEEP + "_seeds"; "" to skip
selection_seeds: list = [1, 2]             # the best lr of a batch size is chosen on these seeds (protocol)
noise_sweep: str = "steps_to_target_noise" # B_simple / B_noise at checkpoints of one run ("" to skip)
confidence: float = 0.95                   # level of every interval (t-intervals over seeds, fit intervals)
perfect_exponent: float = 0.8              # regime boundary: fitted scaling exponent above this is perfect scaling
maximal_exponent: float = 0.2              # ... and below this, maximal data parallelism
measure_at_target: bool = True             # B_simple at each fitted run's target weights (torch, ~2-4 s each)
targets: list = [0.5, 0.4, 0.35, 0.3]      # secondary: B_crit at each of these losses (not below the target)
two_batch_sizes: list = [20, 80]           # (B_small, B_big) of the two-batch estimator at the noise checkpoints
two_batch_pairs: int = 200                 # independent batch pairs per checkpoint (0: skip)
summaries_test: bool = False               # protocol v4 mechanism test, r under every summary and the two-batch
                                           # estimate at every fitted run's target weights (needs measure_at_target)
lr_table: Optional[str] = None             # confirmatory runs (protocol v3): a committed tuned_lr.csv whose lr per
                                           # batch size SWEEP ran on fresh seeds; nothing is selected here, every
                                           # run is a confirmation point (set seeds_sweep ""). None: select on SWEEP

# %%

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import display

from bsresearch import results, stats
from bsresearch.config import ConfigError
from bsresearch.findings import steps_to_target as stt
from bsresearch.paths import project_path
from bsresearch.plots import figure_grid, learning_curves, save_figure
from bsresearch.plots.findings.steps_to_target import (
    b_crit_vs_target,
    examples_vs_batch,
    noise_at_target_vs_batch,
    noise_vs_training,
    regime_legend_text,
    steps_vs_batch,
    steps_vs_lr,
    tuned_lr_vs_batch,
    two_batch_vs_exact,
)

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
tried = results.finished(runs, include_diverged=True)   # a diverged run is a data point (no steps)
missing = runs[~runs["state"].isin(["ok", "diverged"])]
if len(missing):
    print("NOT finished (left out; rerun the sweep with --retry-failed):")
    display(missing[["batch_size", "lr", "seed", "state", "error"]])
targets_found = tried["target_loss"].unique()
assert len(targets_found) == 1 and set(tried["budget"]) == {"target"}, "one target-loss budget expected"
target = float(targets_found[0])
# the seeds the lr was chosen on, as the captions say it: with lr_table, `selection_seeds` of the sweep that
# wrote that table (its spec's two-stage rule, seeds 1 and 2), never this sweep's seeds
lr_chosen_on = (f"seeds {selection_seeds} of the sweep that wrote {lr_table}" if lr_table
                else f"seeds {selection_seeds}")
if lr_table:   # the lr was chosen on another sweep's selection seeds; this sweep's seeds are all confirmation
    chosen_lrs = pd.read_csv(project_path(lr_table))
    selection_seeds = sorted(int(s) for s in tried["seed"].unique())
    selection = tried
    print(f"lr per batch size from {lr_table} (chosen on the selection seeds of its own sweep); every run of "
          f"{sweep} (seeds {selection_seeds}) is a confirmation point")
else:
    selection = tried[tried["seed"].isin(selection_seeds)]
    if set(tried["seed"]) - set(selection_seeds):
        print(f"seeds {sorted(set(tried['seed']) - set(selection_seeds))} of {sweep} are not selection seeds: "
              f"left out")

seeds_name = f"{sweep}_seeds" if seeds_sweep is None else seeds_sweep
confirmation = None
if seeds_name:
    try:
        results.sweep_dir(seeds_name, runs_dir)
        seeds_runs = results.load(seeds_name, runs_root=runs_dir)
        confirmation = results.finished(seeds_runs, include_diverged=True)
        unfinished = seeds_runs[~seeds_runs["state"].isin(["ok", "diverged"])]
        if len(unfinished):
            print(f"NOT finished in {seeds_name} (left out; rerun with --retry-failed): "
                  + ", ".join(f"B {r.batch_size:g} seed {r.seed:g} {r.state}" for r in unfinished.itertuples()))
    except ConfigError as exc:   # SweepMissing: names the command
        print(f"seeds sweep {seeds_name!r} has not run ({exc}); going on with the selection seeds "
              f"{selection_seeds} only: FEWER THAN 5 SEEDS per batch size")
print(f"target: full-train loss <= {target:g}; batch sizes {sorted(int(b) for b in tried.batch_size.unique())}; "
      f"{results.budget_description(tried)}")

# %% [markdown]
# ## The tuned lr (selection seeds), the confirmation seeds, and the fit's points

# %%
if lr_table:   # the chosen lr's grid (interior or not) is the selection's, read from the table
    tuned, per_seed, mismatches = stt.lr_chosen_elsewhere(tried, chosen_lrs, confidence=confidence)
else:          # best lr per batch size, on the selection seeds
    tuned = stt.tuned_table(selection, confidence=confidence)
    per_seed, mismatches = stt.add_confirmation_seeds(stt.at_best_lr(selection, tuned), confirmation, tuned)
for m in mismatches.itertuples():
    print(f"batch size {m.batch_size:g}: {m.n_runs} run(s) at lr {m.lr_run:g}, not at the chosen lr "
          f"{m.lr_best:g}: left out")
seeds_per_batch = per_seed.groupby("batch_size")["seed"].nunique()
min_reached = min(stt.MIN_REACHED, int(seeds_per_batch.max()))   # with 2 seeds only: both must reach it
points, counts = stt.fit_points(per_seed, min_reached=min_reached)
display(counts)
if points["batch_size"].nunique() < 2:
    raise ConfigError(f"PRIMARY 1: NOT TESTABLE: {points['batch_size'].nunique()} batch size(s) with >= {min_reached} "
                      f"seeds at the best lr that reached the target (table above); rerun the missing seeds")
fit = results.critical_batch(points, confidence=confidence)
b_test = stt.critical_batch_test(fit, points["batch_size"].unique(), bool(tuned["interior"].all()))
fraction, b_largest, n_train = stt.largest_batch_fraction(tried)
seed_counts = sorted(set(seeds_per_batch))
left_out = counts[counts["n_reached"] < counts["n_seeds"]]

# %%
# B_simple at the weights where each run of the fit first reached the target (its final checkpoint)
at_weights = pd.DataFrame()
if measure_at_target:
    import torch

    from bsresearch import noise as noise_measure
    from bsresearch.findings.runs import measure_each_run
    from bsresearch.noise import gradient_noise_scale
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"   # where the runs were trained does not matter

    def noise_at_target(run, model, data, cfg):
        ns = gradient_noise_scale(model, data.x_train, data.y_train, unbiased=False)
        row = {"batch_size": run["batch_size"], "lr": run["lr"], "seed": run["seed"], "stage": run["stage"],
               "step": run["steps"], "train_loss": run["train_loss"], "b_simple": ns.b_simple,
               "trace_cov": ns.trace_cov, "grad_sq_norm": ns.grad_sq_norm}
        if summaries_test:   # the two-batch estimate at the same weights (never an input to a primary)
            b_small, b_big = (int(v) for v in two_batch_sizes)
            generator = torch.Generator().manual_seed(int(run["seed"]) * 100_000 + int(run["steps"]))
            pairs = noise_measure.two_batch_pairs(model, data.x_train, data.y_train, b_small, b_big, two_batch_pairs,
                                                  generator)
            row["two_batch"] = noise_measure.two_batch_summary(pairs, confidence=confidence)["b_simple"]
        return row

    at_weights = measure_each_run(points, noise_at_target, device)
    at_weights.to_csv(out / "b_simple_at_target.csv", index=False)
r_test = stt.noise_ratio_test(at_weights, b_test) if len(at_weights) else None

# %% [markdown]
# ## Pre-registered tests (primary)

# %%
primary = [
    f"PRIMARY 1, steps to target (docs/protocols.md#steps-to-target): B_crit = {b_test.b_crit:.3g}, "
    f"{confidence:.0%} interval [{b_test.b_crit_low:.3g}, {b_test.b_crit_high:.3g}]; threshold: the interval "
    f"within [4 B_min, B_max/4] = [{b_test.lower:.3g}, {b_test.upper:.3g}]; VERDICT: {b_test.verdict.upper()} "
    f"({b_test.reason}).",
    f"  validity: every best lr interior: {b_test.all_interior}; {b_test.n_batch_sizes} batch sizes in the fit "
    f"(>= {stt.MIN_BATCH_SIZES} needed); {len(points)} points.",
    (f"PRIMARY 2, noise scale vs B_crit (docs/protocols.md#steps-to-target-noise): r = B_simple,target / B_crit = "
     f"{r_test.b_simple:.3g} / {b_test.b_crit:.3g} = {r_test.ratio:.3g}, interval [{r_test.ratio_low:.3g}, "
     f"{r_test.ratio_high:.3g}]; threshold: r and its interval within [{r_test.lower:g}, {r_test.upper:g}]; "
     f"VERDICT: {r_test.verdict.upper()} ({r_test.reason}). B_simple,target = mean tr(Sigma) / mean |G|^2 over "
     f"the {r_test.n_runs} runs of the fit at their target weights." if r_test is not None else
     "PRIMARY 2, noise scale vs B_crit: NOT COMPUTED (measure_at_target is false)."),
    f"Seeds per batch size at the best lr: {'-'.join(map(str, seed_counts))} "
    + (f"(seeds {selection_seeds} of {sweep}, at the lr chosen in {lr_table}" if lr_table else
       f"(selection seeds {selection_seeds}"
       + (f" + seeds sweep {seeds_name}" if confirmation is not None else ", no seeds sweep"))
    + ("" if min(seed_counts) >= 5 else "; FEWER THAN THE PROTOCOL'S 5") + ").",
    f"Largest batch: B = {b_largest} of N = {n_train} training examples, B/N = {fraction:.3g}.",
]
if len(left_out):
    primary.append("Runs at the best lr that did not reach the target (left out of the fit): "
                   + ", ".join(f"B {r.batch_size:g}: {r.n_seeds - r.n_reached} of {r.n_seeds}"
                               for r in left_out.itertuples()) + ".")
if not counts["in_fit"].all():
    primary.append(f"Batch sizes left out of the fit altogether (fewer than {min_reached} seeds at the best lr "
                   f"reached the target): {[int(b) for b in counts.loc[~counts['in_fit'], 'batch_size']]}.")
if len(mismatches):
    primary.append(f"Seeds-sweep runs at another lr than the re-selected best (left out): batch sizes "
                   f"{mismatches['batch_size'].tolist()}.")
print("\n".join(primary))
if summaries_test and len(at_weights):   # protocol v4: the noise-scale mechanism test
    summaries = stt.noise_ratio_summaries(at_weights, points, confidence=confidence)
    mechanism = stt.noise_summary_test(summaries, b_test)
    mechanism.table.to_csv(out / "noise_summaries.csv", index=False)
    agreement = stt.two_batch_agreement(at_weights.rename(columns={"b_simple": "exact"}), confidence=confidence)
    agreement.table.to_csv(out / "two_batch_at_target.csv", index=False)
    print(f"MECHANISM VERDICT (protocol v4, docs/protocols.md#steps-to-target-mechanism): "
          f"{mechanism.verdict.upper()} ({mechanism.reason})")
    for r in mechanism.table.itertuples():
        print(f"  r ({r.summary}) = {r.b_simple:.3g} / {r.b_crit:.3g} = {r.ratio:.3g}, seed-bootstrap interval "
              f"[{r.ratio_low:.3g}, {r.ratio_high:.3g}] (B_crit refitted in each resample), B_crit's fit interval "
              f"only [{r.fit_low:.3g}, {r.fit_high:.3g}]; within [{mechanism.lower:g}, {mechanism.upper:g}]: "
              f"{r.inside}")
    print(f"  two-batch ({two_batch_sizes[0]}, {two_batch_sizes[1]}; {two_batch_pairs} pairs) against exact at the "
          f"{agreement.n} target weights: {agreement.n_within} within a factor {agreement.tolerance:g} "
          f"({agreement.share_within:.0%}), geometric-mean ratio {agreement.geo_ratio:.3g} [{agreement.geo_low:.3g}, "
          f"{agreement.geo_high:.3g}] over {agreement.n_seeds} seeds: {'agrees' if agreement.agrees else 'DIFFERS'} "
          f"(the exact value is the one every primary uses)")

# %% [markdown]
# ## Secondary: the fit three ways, seeds 3-5 alone, regimes, measured exponents, the tuned lr
#
# Fitted in log space (`bsresearch.measure.critical`): every seed's point ("all seeds", the primary), the seed
# means, each seed alone, and the confirmation seeds 3-5 alone (their lr was chosen on other seeds, so their
# steps carry no selection optimism). Intervals are Student-t on the log parameters from the fit's residuals.

# %%
fits = stt.critical_batch_fits(points, confidence=confidence)
confirm_points = points[points["stage"] == "confirmation"]
if confirm_points["batch_size"].nunique() >= 2:
    only = stt.critical_batch_fits(confirm_points, confidence=confidence)
    only = only[only["fit"] == "all seeds"].assign(fit="confirmation seeds only (3-5)")
    fits = pd.concat([fits, only], ignore_index=True)
lr_fit = stt.fit_tuned_lr(tuned, confidence=confidence) if tuned["interior"].sum() >= 2 else None
low, high = stt.regime_boundaries(fit.b_crit, perfect_exponent, maximal_exponent)
summary = stats.summarize(points, "batch_size", ["steps_to_target", "examples_to_target"], confidence)
summary = summary.rename(columns=lambda c: c.replace("steps_to_target", "steps")
                         .replace("examples_to_target", "examples"))
tuned = tuned[["batch_size", "lr", "interior", "lr_min", "lr_max", "n_lrs"]].merge(
    counts, on="batch_size").merge(summary.drop(columns=["n"]), on="batch_size", how="left")
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
print(f"(secondary) S_min = {fit.s_min:.4g} ({fit.s_min_interval[0]:.4g}-{fit.s_min_interval[1]:.4g}), "
      f"E_min = {fit.e_min:.4g} examples; rms log residual {fit.rms_log_residual:.3f}")
print(f"(secondary) regimes of the fitted curve: perfect scaling B <= {low:.3g}, diminishing returns "
      f"{low:.3g} < B < {high:.3g}, maximal data parallelism B >= {high:.3g}")
steps_resolution = tried.groupby("batch_size")["eval_every"].first() / tuned.set_index("batch_size")["steps_mean"]
print("steps-to-target resolution (eval_every / steps):",
      ", ".join(f"B {b:g}: {r:.1%}" for b, r in steps_resolution.items()))
# every (batch size, lr) of the selection: how many seeds reached the target, mean steps, the states
by_lr = stats.summarize(selection, ["batch_size", "lr"], ["steps_to_target"], confidence)
by_cell = selection.groupby(["batch_size", "lr"])
states = by_cell["state"].agg(lambda s: ", ".join(f"{k} {v}" for k, v in s.value_counts().items()))
reached = by_cell["steps_to_target"].agg(lambda s: int(pd.to_numeric(s, errors="coerce").notna().sum()))
by_lr = by_lr.merge(states.rename("states").reset_index(), on=["batch_size", "lr"]).merge(
    reached.rename("n_reached").reset_index(), on=["batch_size", "lr"])
by_lr.to_csv(out / "steps_by_lr.csv", index=False)
display(fit_table)
display(tuned)
exponents

# %%
interval_words = (f"mean over seeds with its {confidence:.0%} t interval over seeds "
                  f"({'-'.join(map(str, seed_counts))} seeds per batch size)")
fig, axes = figure_grid(2, width=5.2, height=4.0)
steps_vs_batch(axes[0], points, tuned, fit, perfect=perfect_exponent, maximal=maximal_exponent)
examples_vs_batch(axes[1], points, tuned, fit, perfect=perfect_exponent, maximal=maximal_exponent)
save_figure(fig, out / "steps_to_target",
            f"{b_test.verdict.upper()} (pre-registered: B_crit's {confidence:.0%} interval "
            f"[{b_test.b_crit_low:.3g}, {b_test.b_crit_high:.3g}] within [4 B_min, B_max/4] = "
            f"[{b_test.lower:.3g}, {b_test.upper:.3g}]). Left: steps to the first evaluation with full-train loss "
            f"<= {target:g} against batch size, at each batch size's best lr (plain SGD, constant lr; chosen on "
            f"{lr_chosen_on}); grey: each seed, blue: {interval_words}; line: S = S_min (1 + B_crit/B) "
            f"fitted to every seed's point, B_crit = {fit.b_crit:.3g} (dotted; interval: dark bar at the bottom), "
            f"S_min = {fit.s_min:.4g} (dashed). Right: examples to the target E = S B with E = E_min (1 + B/B_crit), "
            f"E_min = {fit.e_min:.4g} (dashed). Largest B/N = {fraction:.3g}. "
            + regime_legend_text(perfect_exponent, maximal_exponent), runs=points)
plt.show()

# %%
fig, axes = figure_grid(2, width=5.2, height=4.0)
tuned_lr_vs_batch(axes[0], tuned, selection, lr_fit=lr_fit)
steps_vs_lr(axes[1], selection)
save_figure(fig, out / "tuned_lr",
            f"Left: the best constant lr per batch size (fewest mean steps to train loss <= {target:g} over "
            f"{lr_chosen_on}; filled: interior to the lrs tried, open: on the grid's edge), every lr tried (grey "
            f"ticks)" + ("" if lr_fit is None else
               f", and eps(B) = eps_max/(1 + B_lr/B) fitted to the interior best lrs: eps_max = {lr_fit.eps_max:.2g}, "
               f"B_lr = {lr_fit.b_lr:.3g} (interval {lr_fit.b_lr_interval[0]:.3g}-{lr_fit.b_lr_interval[1]:.3g}; "
               f"the lrs are on a factor-2 grid)") + f". Right: mean steps to the target over seeds {selection_seeds} "
            "against the lr, one line per batch size, coloured by batch size (colour bar); an lr where some seed "
            "never reached the target has no steps and is marked in the grey strip at the top: x = a seed diverged, "
            "triangle = a seed hit its step cap.", runs=selection)
plt.show()

# %%
# learning curves at the best lr: full-train loss against steps, mean over seeds, one line per batch size
history = results.load_history(points)
fig, axes = figure_grid(2, width=5.2, height=4.0)
learning_curves(axes[0], history, "train_loss", x="step", errorbar=None, palette="viridis")
learning_curves(axes[1], history, "train_loss", x="examples", errorbar=None, palette="viridis")
for ax in axes:
    ax.axhline(target, color="0.3", linestyle=":", linewidth=1)
    ax.legend(title="batch size", fontsize=6, title_fontsize=7, ncols=2)
save_figure(fig, out / "learning_curves_best_lr",
            f"Full-train loss against steps (left) and examples (right) at each batch size's best lr, mean "
            f"over seeds; dotted: the target {target:g}. Runs stop at the first evaluation at or below it.",
            runs=points)
plt.show()

# %% [markdown]
# ## Secondary: B_crit at several target losses
#
# The same runs' evaluation histories give the steps to looser targets (a run reaches a looser target
# first). Per target: steps = the first evaluation at or below it (no interpolation), the best lr by the same
# rule on the selection seeds, the runs of every seed at that lr (a seeds-sweep run counts only where its lr
# is that target's best), the same fit rules. Does B_crit grow as the loss falls (McCandlish et al.)?

# %%
by_target = pd.DataFrame()
use_targets = sorted({float(t) for t in targets if t >= target} | {target}, reverse=True)
if [t for t in targets if t < target]:
    print(f"targets below {target:g} left out (the runs stop there): {[t for t in targets if t < target]}")
if len(use_targets) > 1:
    all_runs = pd.concat([selection, confirmation], ignore_index=True) if confirmation is not None else selection
    histories = results.load_history(all_runs, columns=["batch_size", "lr", "seed"])
    steps_long = stt.steps_at_targets(histories, use_targets)
    by_target = stt.b_crit_by_target(steps_long, selection_seeds, confidence, min_reached)
    by_target.to_csv(out / "b_crit_by_target.csv", index=False)
    display(by_target)
    fig, ax = plt.subplots(figsize=(4.8, 3.8), layout="constrained")
    b_crit_vs_target(ax, by_target)
    grows = by_target.sort_values("target")["b_crit"].is_monotonic_decreasing
    save_figure(fig, out / "b_crit_by_target",
                f"(Secondary.) B_crit of S = S_min (1 + B_crit/B) fitted at each target full-train loss (the first "
                f"evaluation at or below it; best lr re-chosen per target on seeds {selection_seeds}), with its "
                f"{confidence:.0%} fit interval; 'n B': batch sizes in the fit. B_crit "
                f"{'grows' if grows else 'does not grow monotonically'} as the target loss falls "
                f"({', '.join(f'{r.target:g}: {r.b_crit:.3g}' for r in by_target.itertuples())}).", runs=all_runs)
    plt.show()

# %% [markdown]
# ## Secondary: the gradient noise scale along training, and the two-batch estimator against the exact value
#
# Runs with the same seed, batch size and constant lr follow one trajectory whatever their step budget, so
# the noise sweep's fixed-step runs end at checkpoints of one run; each measured exact B_simple over the
# training set (per-example gradients, `unbiased=False`) and B_noise = tr(H Sigma)/(G^T H G) (Hutchinson, 10
# probes). At each checkpoint the two-batch estimator (noise.two_batch_estimate, the one the training loop
# uses) is evaluated on `two_batch_pairs` independent (B_small, B_big) batch pairs drawn with replacement;
# its value is mean tr(Sigma) / mean |G|^2 over the pairs, with a bootstrap interval over the pairs.

# %%
noise = pd.DataFrame()
noise_runs = None
if noise_sweep:
    try:
        results.sweep_dir(noise_sweep, runs_dir)
        noise_runs = results.load(noise_sweep, runs_root=runs_dir)
    except ConfigError as exc:   # that sweep has not been run
        print(f"no noise-scale checkpoints: {exc}")
if noise_runs is not None:
    noise_states = noise_runs["state"].value_counts().items()
    print(f"{len(noise_runs)} noise runs: " + ", ".join(f"{s} {n}" for s, n in noise_states))
    noise = stt.noise_checkpoints(noise_runs)
two_batch = pd.DataFrame()
if len(noise):
    point = noise[["batch_size", "lr"]].drop_duplicates()
    assert len(point) == 1, "one batch size and lr expected in the noise sweep"
    b0, lr0 = point.iloc[0]
    same = selection[(selection["batch_size"] == b0) & (selection["lr"] == lr0)]
    check = noise.merge(results.load_history(same)[["seed", "step", "train_loss"]], on=["seed", "step"],
                        suffixes=("", "_target_run"))
    print(f"noise runs: batch {b0:g}, lr {lr0:g} (best lr of that batch size: "
          f"{tuned.set_index('batch_size').loc[b0, 'lr']:g}); same-trajectory check at {len(check)} steps: "
          f"max |train loss difference| = {np.abs(check.train_loss - check.train_loss_target_run).max():.2g}")
    # (secondary) interpolated at the target loss, log-log between the checkpoints around it
    at_target = stt.value_at_loss(noise, target, "b_simple").merge(
        stt.value_at_loss(noise, target, "b_noise")[["seed", "b_noise"]], on="seed")
    noise.to_csv(out / "noise_scale_checkpoints.csv", index=False)
    display(at_target)
    ok_noise = results.finished(noise_runs)
    if two_batch_pairs > 0 and ok_noise["run_dir"].map(lambda d: (project_path(d) / "checkpoint.pt").exists()).all():
        import torch

        from bsresearch import noise as noise_measure
        from bsresearch.findings.runs import measure_each_run
        torch.set_num_threads(1)
        b_small, b_big = (int(v) for v in two_batch_sizes)

        def two_batch_at(run, model, data, cfg):
            generator = torch.Generator().manual_seed(int(run["seed"]) * 100_000 + int(run["steps"]))
            pairs = noise_measure.two_batch_pairs(model, data.x_train, data.y_train, b_small, b_big, two_batch_pairs,
                                                  generator)
            est = noise_measure.two_batch_summary(pairs, confidence=confidence)
            return {"seed": run["seed"], "step": run["steps"], "train_loss": run["train_loss"],
                    "exact": run["noise_b_simple"], "two_batch": est["b_simple"], "two_batch_low": est["low"],
                    "two_batch_high": est["high"], "n_pairs": est["n_pairs"],
                    "frac_pairs_negative": est["frac_pairs_negative"]}

        two_batch = measure_each_run(ok_noise.sort_values(["seed", "steps"]), two_batch_at, "cpu").assign(
            ratio=lambda d: d.two_batch / d.exact,
            exact_inside=lambda d: (d.two_batch_low <= d.exact) & (d.exact <= d.two_batch_high))
        two_batch.to_csv(out / "two_batch_vs_exact.csv", index=False)
        finite = two_batch[np.isfinite(two_batch["ratio"]) & (two_batch["ratio"] > 0)]
        geo = float(np.exp(np.log(finite["ratio"]).mean())) if len(finite) else float("nan")
        print(f"(secondary) two-batch ({b_small}, {b_big}; {two_batch_pairs} pairs) against exact B_simple at "
              f"{len(two_batch)} checkpoints: ratio two-batch / exact geometric mean {geo:.3g}, range "
              f"{finite['ratio'].min():.3g}-{finite['ratio'].max():.3g}; the exact value inside the "
              f"{confidence:.0%} bootstrap interval at {int(two_batch['exact_inside'].sum())} of {len(two_batch)}")
        display(two_batch)
    elif two_batch_pairs > 0:
        print(f"two-batch estimator not evaluated: the {noise_sweep} runs have no checkpoint.pt (the spec needs "
              f"save_checkpoint: true; rerun that sweep)")

# %%
n_nonpositive = {c: int((noise[c] <= 0).sum()) for c in ("b_simple", "b_noise") if c in noise}
if len(noise):
    n_panels = 2 + bool(len(at_weights)) + bool(len(two_batch))
    fig, axes = figure_grid(n_panels, width=4.6, height=3.8)
    noise_vs_training(axes[0], noise, fit, x="step")
    noise_vs_training(axes[1], noise, fit, x="train_loss", target_loss=target)
    axes[0].set_title(f"batch {b0:g}, lr {lr0:g}", fontsize=9)
    k = 2
    if len(at_weights):
        noise_at_target_vs_batch(axes[k], at_weights, fit)
        k += 1
    if len(two_batch):
        two_batch_vs_exact(axes[k], two_batch)
    save_figure(fig, out / "noise_scale",
                f"Exact B_simple = tr(Sigma)/|G|^2 over the {n_train} training examples (blue) and B_noise = "
                f"tr(H Sigma)/(G^T H G) (red; 10 Hutchinson probes, bars: standard error) at checkpoints of the "
                f"batch-{b0:g}, lr-{lr0:g} run, each seed a line, against steps (first panel) and the full-train "
                f"loss (second; ordinary log axis, training runs right to left; dotted: the target {target:g}). "
                f"Values <= 0 (B_noise: negative curvature along the gradient) are open triangles on the bottom "
                f"edge: {n_nonpositive.get('b_noise', 0)} of {len(noise)} B_noise, "
                f"{n_nonpositive.get('b_simple', 0)} B_simple. Dashed line and grey band: B_crit = {fit.b_crit:.3g} "
                f"from the steps-to-target fit and its {confidence:.0%} interval."
                + (" Third: exact B_simple at the weights where each run of the fit first reached the target "
                   "(each run, and the geometric mean per batch size)." if len(at_weights) else "")
                + (f" Last: the two-batch estimate (B_small {two_batch_sizes[0]}, B_big {two_batch_sizes[1]}, "
                   f"{two_batch_pairs} pairs: mean tr(Sigma)/mean |G|^2, {confidence:.0%} bootstrap interval over "
                   f"the pairs) against the exact value at each checkpoint." if len(two_batch) else ""), runs=tried)
    plt.show()
elif len(at_weights):   # no noise sweep (analysis_parameters: {noise_sweep: ""}): B_simple at the target only
    fig, ax = plt.subplots(figsize=(4.6, 3.8), layout="constrained")
    noise_at_target_vs_batch(ax, at_weights, fit)
    save_figure(fig, out / "noise_scale",
                f"Exact B_simple = tr(Sigma)/|G|^2 over the {n_train} training examples at the weights where "
                f"each run of the fit first reached the target (each run, and the geometric mean per batch size). "
                f"Dashed line and grey band: B_crit = {fit.b_crit:.3g} from the steps-to-target fit and its "
                f"{confidence:.0%} interval.", runs=tried)
    plt.show()

# %% [markdown]
# ## Summary: the primary tests first, then the secondary comparisons of B_crit with the noise scale

# %%
rows = [{"quantity": "B_crit (steps-to-target fit, all seeds; PRIMARY)", "value": fit.b_crit,
         "low": fit.b_crit_interval[0], "high": fit.b_crit_interval[1]}]
if r_test is not None:
    rows.append({"quantity": "B_simple at the target weights, ratio of means (PRIMARY numerator)",
                 "value": r_test.b_simple, "low": np.nan, "high": np.nan})
for _, r in fits.iterrows():
    if r["fit"] != "all seeds":
        rows.append({"quantity": f"(secondary) B_crit ({r['fit']})", "value": r["b_crit"], "low": r["b_crit_low"],
                     "high": r["b_crit_high"]})
if lr_fit is not None:
    rows.append({"quantity": "(secondary) B_lr (tuned-lr fit)", "value": lr_fit.b_lr,
                 "low": lr_fit.b_lr_interval[0], "high": lr_fit.b_lr_interval[1]})


def spread(values):
    values = pd.Series(values, dtype=float).dropna()
    return values.mean(), values.min(), values.max()


if len(at_weights):
    mean, lo, hi = spread(at_weights["b_simple"])
    rows.append({"quantity": "(secondary) B_simple at the target weights, per run (mean, min, max)",
                 "value": mean, "low": lo, "high": hi})
if len(noise):
    for name, column in (("B_simple", "b_simple"), ("B_noise", "b_noise")):
        mean, lo, hi = spread(at_target[column])
        rows.append({"quantity": f"(secondary) {name} at the target loss (batch {b0:g} run, INTERPOLATED between "
                                 "checkpoints; mean, min, max over seeds)", "value": mean, "low": lo, "high": hi})
        positive = noise.loc[noise[column] > 0, column]
        mean, lo, hi = spread(positive)
        rows.append({"quantity": f"(secondary) {name} along training (checkpoints where it is > 0, {len(positive)} "
                     f"of {len(noise)}: mean, min, max)", "value": mean, "low": lo, "high": hi})
comparison = pd.DataFrame(rows)
comparison["ratio_to_b_crit"] = comparison["value"] / fit.b_crit
comparison.to_csv(out / "noise_vs_critical.csv", index=False)
published = pd.DataFrame({"task": ["MNIST", "SVHN", "CIFAR-10", "ImageNet"], "b_crit": [200, 500, 900, 15000],
                          "b_simple": [900, 4000, 2000, 30000]}).assign(ratio=lambda d: d.b_simple / d.b_crit)
published.to_csv(out / "mccandlish_table1.csv", index=False)
display(published)
comparison

# %%
# a short text summary next to the figures: the primary tests first
lines = ["## Pre-registered tests (docs/protocols.md#steps-to-target)", "", *[f"- {p.strip()}" for p in primary], "",
         "## Secondary", "", results.provenance_caption(pd.concat([tried, confirmation]) if confirmation is not None
                                                          else tried), "",
         f"Target: full-train loss <= {target:g}. S_min = {fit.s_min:.4g}; E_min = {fit.e_min:.4g} examples "
         f"({fit.e_min / n_train:.2g} epochs); rms log residual {fit.rms_log_residual:.3f}.",
         f"Regimes (fitted exponent {perfect_exponent:g} / {maximal_exponent:g}): perfect scaling B <= {low:.3g}, "
         f"diminishing returns up to {high:.3g}, maximal data parallelism beyond.", "",
         f"| batch size | best lr | interior | seeds reached / run | in fit | steps (mean, {confidence:.0%} t "
         "interval) | examples (mean) | regime (fit) |",
         "|---|---|---|---|---|---|---|---|"]
for _, r in tuned.iterrows():
    lines.append(f"| {r.batch_size:g} | {r.lr:g} | {r.interior} | {r.n_reached} / {r.n_seeds} | {r.in_fit} | "
                 f"{r.steps_mean:.4g} [{r.steps_low:.4g}, {r.steps_high:.4g}] | {r.examples_mean:.4g} | {r.regime} |")
if len(by_target):
    lines += ["", "B_crit by target loss (secondary): " + "; ".join(
        f"{r.target:g}: {r.b_crit:.3g} [{r.b_crit_low:.3g}, {r.b_crit_high:.3g}] ({r.n_batch_sizes} batch sizes)"
        for r in by_target.itertuples()) + "."]
lines += ["", "| quantity | value | low | high | / B_crit |", "|---|---|---|---|---|"]
for _, r in comparison.iterrows():
    lines.append(f"| {r.quantity} | {r.value:.3g} | {r.low:.3g} | {r.high:.3g} | {r.ratio_to_b_crit:.2g} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
