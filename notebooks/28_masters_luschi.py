# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Masters & Luschi (2018): the range of stable learning rates narrows as the batch size grows
#
# **Claim.** Written as a base rate per example (lr = base rate x B, linear scaling), the range of learning
# rates that train stably and well shrinks as B grows; the best test results come from batches of 2 to 32.
#
# **Here** (`experiments/masters_luschi.yaml`, every setting justified there): MNIST-1D with 40000 signals,
# cnn1d, SGD momentum 0.9, constant lr under linear scaling from B = 8 (`lr` is the rate at B = 8), 5 epochs
# for every B; B in {8, 32, 128, 512, 2048} (largest B/N = 0.05) x lr 2^-9 .. 2^1; 5 seeds.
#
# **Pre-registered test** (docs/protocols.md#masters-luschi): the slopes against log2(B) of log2(largest lr
# without divergence) and of the good-lr window's width (octaves within 1 point of the best test accuracy),
# each with a 95% percentile bootstrap interval over seeds; reproduced when both intervals lie below 0,
# partly when one does; not testable when at some B no lr diverged or the best lr is at the grid's edge.
#
# **Mechanism test** (protocol version 4, docs/protocols.md#masters-luschi-mechanism;
# `experiments/masters_luschi_mechanism.yaml` sets `learns`): "stable" means every seed finished without
# diverging *and* learned (test accuracy >= `learns`, 0.5; chance is 0.1), so runs stuck at chance do not count.
# The same slopes and thresholds; a batch size where no lr learns is named and left out, and fewer than 4 batch
# sizes with a learning lr make the test not testable. The version-1 reading (no divergence) of the same runs is
# printed beside it and never pooled with it.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "masters_luschi"                       # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                              # root folder of run directories (relative: to the project)
out_dir: str = "reports/masters_luschi"             # figures and tables go here (relative: to the project)
spec_path: Optional[str] = "experiments/masters_luschi.yaml"  # the spec: which variant each run is
extension_sweep: str = "masters_luschi_ext"         # the grid's extension (protocol's rule); "" for none
metric: str = "test_acc"                            # higher is better; its mean over seeds ranks the lrs
margin: float = 0.01                                # the good window: within this of the best (1 point)
other_margins: list = [0.005, 0.02]                 # secondary: the same table at 0.5 and 2 points
n_boot: int = 2000                                  # bootstrap resamples of the seeds (the protocol's 2000)
confidence: float = 0.95                            # of every interval
learns: Optional[float] = None                      # mechanism test (v4), stable means every seed reaches this test acc
other_learns: list = [0.25, 0.75]                   # with learns: the secondary thresholds

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from bsresearch import results, stats
from bsresearch.findings import masters_luschi as ml
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.plots.findings import masters_luschi as ml_plots
from bsresearch.sweep import variants
from bsresearch.sweep.spec import load_spec

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
rows = variants.runs_per_variant(runs, load_spec(project_path(spec_path))) if spec_path else runs
first_rows = rows                                    # the pre-registered grid alone: its verdict is printed too
if extension_sweep and (runs_dir / extension_sweep).is_dir():
    rows = pd.concat([rows, results.load(extension_sweep, runs_root=runs_dir)], ignore_index=True)
    print(f"with the extension sweep {extension_sweep}: {len(rows) - len(first_rows)} more runs")
elif extension_sweep:
    print(f"no extension sweep {extension_sweep!r} in {runs_dir} (run: bsresearch sweep "
          f"experiments/{extension_sweep}.yaml); the verdict is on the first grid only")
largest = int(rows["batch_size"].max())
setting = (f"{rows['dataset'].iloc[0]} ({int(rows['n_train'].iloc[0])} training examples; largest B/N = "
           f"{largest / rows['n_train'].iloc[0]:.3g}), {rows['model'].iloc[0]}, lr_scaling "
           f"{rows['lr_scaling'].iloc[0]} from B = {int(rows['base_batch_size'].iloc[0])}")
print(f"{len(rows)} runs:", rows["state"].value_counts().to_dict(), "| budget:", results.budget_description(rows))
print(setting)

# %% [markdown]
# ## The pre-registered test

# %%
if learns is None:   # version 1: stable = no seed diverged
    table = ml.stable_lr_table(rows, metric, margin)
    trend = ml.stable_range_trend(rows, metric, margin, n_boot=n_boot, confidence=confidence)
    test = ml.range_test(table, trend)
    stable_words = "largest stable lr"
else:                # version 4: stable = every seed learns
    learning = ml.learning_range_test(rows, learns, metric, margin, n_boot=n_boot, confidence=confidence)
    table, trend, test = learning.table, learning.trend, learning.test
    stable_words = f"largest lr at which every seed learns ({metric} >= {learns:g})"
pct = int(round(100 * confidence))
verdict = pd.DataFrame([{
    "statistic": f"slope of {name} against log2(B)", "estimate": t.slope,
    f"{pct}% bootstrap interval": f"[{t.low:.3f}, {t.high:.3f}]", "threshold": "interval below 0",
    "below 0": ml.below_zero(t), "batch sizes": t.n_batch_sizes, "resamples": t.n_boot}
    for name, t in ((f"log2({stable_words})", test.max_stable_lr), ("window width (octaves)", test.window_octaves))])
verdict["verdict"] = test.verdict
verdict["not testable because"] = test.reason
verdict.to_csv(out / "test.csv", index=False)
(out / "test.md").write_text(f"Margin {100 * margin:g} point(s); {setting}.\n{results.provenance_caption(rows)}\n\n"
                             + stats.frame_markdown(verdict))
print(f"VERDICT{' (mechanism test, protocol v4)' if learns is not None else ''}: {test.verdict}"
      + (f" ({test.reason})" if test.reason else ""))
if learns is not None:
    if learning.no_learning:
        print(f"no lr at which every seed learns at B = {', '.join(f'{b:g}' for b in learning.no_learning)}: "
              "left out of the slopes (an empty range, the narrowest there is)")
    v1 = ml.range_test(ml.stable_lr_table(rows, metric, margin),
                       ml.stable_range_trend(rows, metric, margin, n_boot=n_boot, confidence=confidence))
    deciding = (test.max_stable_lr, test.window_octaves)
    if rows["seed"].nunique() < 8 and any(t.low <= 0 <= t.high + ml.ZERO for t in deciding):
        print("a deciding interval reaches 0 with fewer than 8 seeds: by statistics item 3 the sweep is extended "
              "once, to 8 seeds (the next three in the spec's order), and that result is final")
    print(f"beside it, version 1's reading of the same runs (stable = no divergence): {v1.verdict}, slope of "
          f"log2(largest stable lr) {v1.max_stable_lr.slope:.3f} [{v1.max_stable_lr.low:.3f}, "
          f"{v1.max_stable_lr.high:.3f}]" + (f" ({v1.reason})" if v1.reason else ""))
if len(rows) > len(first_rows):
    first = ml.range_test(ml.stable_lr_table(first_rows, metric, margin),
                          ml.stable_range_trend(first_rows, metric, margin, n_boot=n_boot, confidence=confidence))
    print(f"first verdict, on the pre-registered grid alone: {first.verdict}"
          + (f" ({first.reason})" if first.reason else ""))
verdict.T

# %% [markdown]
# ## Secondary: the table per batch size, the best lr's slope, the best batch size, other margins

# %%
intervals = ml.stable_lr_intervals(rows, metric, margin, n_boot=n_boot, confidence=confidence, learns=learns)
per_batch = table.merge(intervals, on="batch_size", how="left")
per_batch.to_csv(out / "stable_range.csv", index=False)
(out / "stable_range.md").write_text(results.provenance_caption(rows) + "\n\n" + stats.frame_markdown(per_batch))
best = trend["best_lr"]
best_batch = table.loc[table["best"].idxmax()] if table["best"].notna().any() else None
print(f"best lr: slope {best.slope:.3f} per doubling of B, {pct}% interval [{best.low:.3f}, {best.high:.3f}] "
      "(linear scaling predicts 0)")
if best_batch is not None:
    print(f"highest tuned {metric}: {best_batch['best']:.4f} at B = {int(best_batch['batch_size'])} "
          f"(the paper: B <= 32 -> {'yes' if best_batch['batch_size'] <= 32 else 'no'})")
per_batch

# %%
states = stats.summarize_states(rows, ["batch_size", "lr"], [metric, "train_loss"], confidence)
states.to_csv(out / "summary.csv", index=False)
(out / "summary.md").write_text(results.provenance_caption(rows) + "\n\n" + stats.markdown_table(
    states, ["batch_size", "lr"], [metric, "train_loss"], counts=("n_runs", "n_diverged")))
others = pd.concat([ml.stable_lr_table(rows, metric, m).assign(margin=m) for m in other_margins], ignore_index=True)
others_trend = pd.DataFrame([{"margin": m, "column": c, "slope": t.slope, "low": t.low, "high": t.high}
                             for m in other_margins
                             for c, t in ml.stable_range_trend(rows, metric, m, n_boot=n_boot,
                                                            confidence=confidence).items()])
others.to_csv(out / "stable_range_other_margins.csv", index=False)
others_trend.to_csv(out / "trend_other_margins.csv", index=False)
(out / "trend_other_margins.md").write_text(stats.frame_markdown(others_trend))
if learns is not None:   # the secondary thresholds of "learns"
    by_learns = pd.DataFrame([
        {"learns": t.learns, "column": c, "slope": tr.slope, "low": tr.low, "high": tr.high, "verdict": t.test.verdict,
         "no learning lr at B": ", ".join(f"{b:g}" for b in t.no_learning)}
        for t in (ml.learning_range_test(rows, v, metric, margin, n_boot=n_boot, confidence=confidence)
                  for v in other_learns) for c, tr in t.trend.items()])
    by_learns.to_csv(out / "trend_other_learns.csv", index=False)
    display(by_learns)
others_trend

# %% [markdown]
# ## Figure: accuracy against lr per batch size, and the stable range against the batch size

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), layout="constrained")
ml_plots.accuracy_vs_lr_plot(axes[0], rows, metric)
ml_plots.stable_range_plot(axes[1], table, intervals, label=stable_words)
ml_plots.window_width_plot(axes[2], table, intervals, test.window_octaves)
save_figure(fig, out / "stable_range",
            f"Left: mean {metric} over seeds against the lr (the rate at the base batch size under linear scaling) "
            f"per batch size; a cross marks an lr where some seed diverged. Middle: per batch size, the window of "
            f"lrs within {100 * margin:g} point(s) of the best (bar), the best lr (dot; hollow at the grid's edge) "
            f"and the {stable_words} (caret, with its {pct}% bootstrap interval over seeds). Right: "
            f"the window's width in octaves with its bootstrap interval, and the least-squares slope against "
            f"log2(B) (the pre-registered statistic). Verdict: {test.verdict}. Setting: {setting}.", runs=rows)
plt.show()
