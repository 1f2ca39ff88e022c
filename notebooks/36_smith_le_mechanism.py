# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Smith & Le (2018), mechanism test: B_opt at a common train loss
#
# **Why** (docs/protocols.md#smith-le-mechanism): at a fixed budget of epochs the test-accuracy peak B_opt sat on
# the batch size with the lowest final train loss in every lr group, so it may measure how far each batch size
# trains in the budget rather than which noise scale generalizes best. Here every run (variant `matched`) trains
# until its full-train loss is <= 0.01, and B_opt is read among the runs that got there; the fixed budget
# (variant `fixed`, 60 epochs) runs beside it on the same seeds.
#
# **Pre-registered test** (`findings.smith_le.matched_loss_test`): a cell enters the curve when >= 3 of its seeds
# reached the target. Per lr group, B_opt = the parabola vertex in log2 B through the best included cell and its
# neighbours; the group is *peaked* when that cell lies inside the included range and, held out, beats both ends
# of it by a Welch 95% interval above 0. beta_lr^matched = the mean per-seed slope of log B_opt on log lr, 95% t
# interval. *Reproduced*: >= 3 of 4 groups peaked and the interval contains 1 with its lower end above 0;
# *partly*: lower end above 0 and 1-2 groups peaked or the interval excludes 1; *not reproduced*: no group peaked,
# or the lower end at or below 0.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "smith_le_mechanism"                  # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/smith_le_mechanism"        # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/smith_le_mechanism.yaml"   # the spec: which variant each run belongs to
matched_variant: str = "matched"                   # trained to the target train loss
fixed_variant: str = "fixed"                       # the version-1 fixed budget, on the same seeds ("" for none)
edge_sweep: str = ""                               # the edge rule's sweep (its runs join these), or "" for none
edge_spec_path: Optional[str] = None               # that sweep's spec (its variants)
earlier_report: str = "reports/smith_le"           # version 1's verdict, printed beside this one
metric: str = "test_acc"                           # B_opt maximizes it
confidence: float = 0.95                           # of every interval

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from bsresearch import results, stats
from bsresearch.findings import smith_le as sl
from bsresearch.paths import project_path
from bsresearch.plots import figure_grid, save_figure
from bsresearch.plots.findings import smith_le as sl_plots
from bsresearch.sweep import variants

runs_dir, out = project_path(runs_dir), project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)


def matched_rows(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["variant"] == matched_variant].assign(reached=lambda d: d["reached_target"].fillna(False))


grid_rows = variants.sweep_rows(sweep, spec_path, runs_dir)
rows = (pd.concat([grid_rows, variants.sweep_rows(edge_sweep, edge_spec_path, runs_dir)], ignore_index=True)
        if edge_sweep else grid_rows)
print(f"{len(rows)} runs:", dict(rows.groupby(["variant", "state"]).size()))
matched = matched_rows(rows)
fixed = results.finished(rows[rows["variant"] == fixed_variant]) if fixed_variant else pd.DataFrame()
target = float(matched["target_loss"].iloc[0])
fixed_words = (f"fixed {fixed['budget_amount'].iloc[0] / fixed['n_train'].iloc[0]:g} epochs" if len(fixed) else "")
unfinished = rows[~rows["state"].isin(["ok", "diverged"])]
if len(unfinished):
    print(f"NOT finished (rerun the sweep with --retry-failed): {len(unfinished)} runs")

# %% [markdown]
# ## The pre-registered test

# %%
test = sl.matched_loss_test(matched, metric, reached="reached", confidence=confidence)
s = test.slopes
verdict = pd.DataFrame([{
    "statistic": f"beta_lr^matched: mean per-seed slope of log B_opt on log lr, at train loss {target:g}",
    "estimate": s.mean, f"{confidence:.0%} t interval": f"[{s.low:.3f}, {s.high:.3f}]", "seeds": len(s.slopes),
    "per-seed slopes": ", ".join(f"{v:.2f}" for v in s.slopes), "groups peaked": f"{test.n_peaked} of {test.n_groups}",
    "threshold": f">= {test.min_peaked} groups peaked; interval contains 1, lower end > 0",
    "verdict": test.verdict, "why": test.why}])
verdict.to_csv(out / "test.csv", index=False)
print(f"VERDICT (mechanism test, protocol v4): {test.verdict.upper()} - {test.why}")
if test.extend_seeds:
    print("a deciding interval contains its threshold with fewer than 8 seeds: by statistics item 3 the sweep is "
          "extended once, to seeds 35-37")
edges = test.peaks[test.peaks["at_grid_edge"].astype(bool)]
if len(edges) and not edge_sweep:
    print(f"best included cell on the grid's edge at lr {', '.join(f'{v:g}' for v in edges['lr'])}: the protocol "
          "extends that lr's grid one factor of 2 beyond it, once")
if edge_sweep:   # the edge rule was applied once: the verdict above includes its runs; without them, beside it
    grid_only = sl.matched_loss_test(matched_rows(grid_rows), metric, reached="reached", confidence=confidence)
    print(f"with the edge rule's runs ({edge_sweep}): the verdict above; on the grid alone: "
          f"{grid_only.verdict.upper()} - {grid_only.why}")
earlier = project_path(earlier_report) / "test.csv"
if earlier.is_file():   # version 1, other seeds: beside it, never pooled
    first = pd.read_csv(earlier).iloc[0]
    print(f"earlier (version 1, {earlier_report}, fixed budget): {first['statistic']}: {first['estimate']:.3f} "
          f"{first.get(f'{confidence:.0%} t interval', '')} -> {first['verdict']}")
verdict.T

# %% [markdown]
# ## Per lr group: the trainable range, B_opt, and whether it is a peak

# %%
test.peaks.to_csv(out / "peaks.csv", index=False)
cells = sl.reached_cells(matched, reached="reached")
cells.to_csv(out / "reached_cells.csv", index=False)
display(test.peaks)

# %% [markdown]
# ## Beside it: the fixed budget on the same seeds (version-1 rules), and where the optimum sits

# %%
beside = []
if len(fixed):
    fixed_slopes = sl.power_law_by_seed(fixed, metric, confidence=confidence)
    print(f"fixed budget, version-1 rules: beta_lr = {fixed_slopes.mean:.3f} [{fixed_slopes.low:.3f}, "
          f"{fixed_slopes.high:.3f}] -> {fixed_slopes.verdict}")
    fixed_optimum = sl.optimum_by_group(fixed, metric, x="batch_size", by="lr", confidence=confidence).table
    beside.append(sl.argmax_argmin(fixed, metric).assign(budget=fixed_words))
else:
    fixed_optimum = None
reached_runs = matched[matched["reached"].astype(bool)]
beside.append(sl.argmax_argmin(reached_runs, metric).assign(budget=f"to train loss {target:g} (runs that reached it)"))
beside = pd.concat(beside, ignore_index=True)
beside.to_csv(out / "argmax_argmin.csv", index=False)
print("best test accuracy on the lowest final train loss:",
      "; ".join(f"{b}: {int(g['same'].sum())} of {len(g)} groups" for b, g in beside.groupby("budget", sort=False)))
steps = stats.summarize(reached_runs, ["lr", "batch_size"], ["steps", metric], confidence)
steps.to_csv(out / "steps_to_target.csv", index=False)
beside

# %% [markdown]
# ## Figure

# %%
fig, axes = figure_grid(2, width=5.2, height=4.0)
sl_plots.matched_curves_plot(axes[0], matched, test, metric, reached="reached")
axes[0].set_title(f"runs trained to train loss {target:g}", fontsize=10)
sl_plots.optima_vs_lr_plot(axes[1], test.peaks, fixed_optimum, test.slopes, fixed_label=fixed_words)
save_figure(fig, out / "matched_loss",
            f"Smith & Le's B_opt read at a common train loss. Left: final {metric} against batch size per lr, over "
            f"the runs that reached full-train loss {target:g}, in cells where at least 3 of the seeds did (mean and "
            "95% interval over seeds); diamonds: B_opt, the parabola vertex through the best cell and its neighbours, "
            "filled where the group is peaked (its held-out best cell beats both ends of the trainable range by a "
            "Welch 95% interval above 0). Right: B_opt against lr at the common train loss (diamonds) and at the "
            f"{fixed_words} budget on the same seeds (grey squares); red: the pre-registered mean per-seed "
            f"slope {test.slopes.mean:.2f} [{test.slopes.low:.2f}, {test.slopes.high:.2f}] ({confidence:.0%} t "
            f"interval), dotted: the predicted slope 1. Verdict: {test.verdict}.", runs=rows)
plt.show()
