# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 31 · Test accuracy against the ghost batch size: Hoffer, Hubara & Soudry (2017)
#
# **Claim.** BatchNorm statistics over small "ghost" batches inside a large batch reduce the large batch's
# generalization gap without more updates (the paper: ghost batches of the small batch size).
#
# **Here** (`experiments/ghost_batch.yaml`, every setting justified there): MNIST-1D with 40000 signals, cnn1d
# with BatchNorm, SGD momentum 0.9, sqrt-scaled lr (0.283), batch 1024 (B/N = 0.026) for 10 epochs, ghost
# sizes 16 ... 256 and `none` (statistics over the whole batch). 5 seeds.
#
# **Pre-registered test** (docs/protocols.md#ghost-batch): final test accuracy, ghost 32 minus none, Welch's
# 95% interval over seeds; reproduced when it lies above 0.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "ghost_batch"                  # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                      # root folder of run directories (relative: to the project)
out_dir: str = "reports/ghost_batch"        # figures and tables go here (relative: to the project)
spec_path: Optional[str] = "experiments/ghost_batch.yaml"  # the spec: which variant each run is
ghost: int = 32                             # the pre-registered ghost size
margin: float = 0.005                       # half a point, accuracy units: the gain "partly" must not exclude

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from bsresearch import results
from bsresearch.findings.ghost_batch import best_ghost, by_ghost_size, compare_ghost, ghost_slope
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.plots.findings.ghost_batch import accuracy_vs_ghost
from bsresearch.sweep import variants
from bsresearch.sweep.spec import load_spec

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
spec = load_spec(project_path(spec_path))
rows = variants.runs_per_variant(runs, spec)
print(f"{len(rows)} runs:", dict(rows["state"].value_counts()), "| budget:", results.budget_description(rows))

# %% [markdown]
# ## The pre-registered test

# %%
test = compare_ghost(rows, ghost=ghost, margin=margin)
verdict = pd.DataFrame([{
    "statistic": f"test accuracy, ghost {test.ghost} - none (points), batch {test.batch_size}",
    "estimate": round(100 * test.diff, 3), "95% Welch interval": f"[{100 * test.low:.2f}, {100 * test.high:.2f}]",
    "seeds (ghost, none)": f"{test.n_ghost}, {test.n_none}",
    "threshold": f"interval above 0 (partly: contains 0 and reaches above +{100 * margin:g} point)",
    "verdict": test.verdict, "problems": "; ".join(test.problems) or "none"}])
verdict.to_csv(out / "test.csv", index=False)
display(verdict.T)

# %% [markdown]
# ## Secondary: every ghost size, the best one (chosen after the runs: optimistic), the slope

# %%
table = by_ghost_size(rows)
table.to_csv(out / "by_ghost_size.csv", index=False)
display(table[["ghost", "n", "test_acc_mean", "test_acc_std", "vs_none", "vs_none_low", "vs_none_high",
               "train_loss_mean", "gap_loss_mean"]])
top = best_ghost(table)
slope = ghost_slope(rows)
print(f"best ghost size by mean (chosen after the runs, optimistic): {int(top['ghost'])}, "
      f"{100 * top['vs_none']:+.2f} points vs none [{100 * top['vs_none_low']:.2f}, {100 * top['vs_none_high']:.2f}]")
print(f"test accuracy per doubling of the ghost size (16-256): {100 * slope.slope:+.3f} points "
      f"[{100 * slope.low:.3f}, {100 * slope.high:.3f}], t over {slope.n_seeds} per-seed slopes")

# %%
ok = rows[rows["state"] == "ok"]
fig, axes = plt.subplots(1, 3, figsize=(12, 3.5), layout="constrained")
accuracy_vs_ghost(axes[0], rows, table, "test_acc")
accuracy_vs_ghost(axes[1], rows, table, "train_loss")
accuracy_vs_ghost(axes[2], rows, table, "gap_loss")
save_figure(fig, out / "by_ghost_size",
            "Final test accuracy, train loss (on the eval_train_size subset) and test minus train loss against the "
            f"ghost batch size at batch {test.batch_size} (none: BatchNorm statistics over the whole batch). "
            "Grey: each seed; blue: mean over seeds with its t interval; dashed: the whole-batch mean.", runs=ok)
plt.show()
