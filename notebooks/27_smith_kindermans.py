# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Smith, Kindermans, Ying & Le (2018): increase the batch size instead of decaying the learning rate
#
# **Claim.** Multiplying the batch size by a factor at the epochs where a step schedule would divide the lr
# by that factor reaches the same test accuracy after the same epochs, with fewer parameter updates.
#
# **Here** (`experiments/smith_kindermans.yaml`, every setting justified there): MNIST-1D with 40000 signals,
# cnn1d, SGD momentum 0.9, lr 0.05, 10 epochs, milestones at 50% and 75%. `decay`: batch 32, lr x 0.2 at each
# milestone. `ramp`: constant lr, batch 32 -> 160 -> 800 at the milestones. 5 seeds.
#
# **Pre-registered test** (docs/protocols.md#smith-kindermans): final test accuracy, ramp minus decay, Welch's
# 95% interval over seeds; reproduced when it lies inside [-1, +1] point with fewer updates.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "smith_kindermans"                     # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                              # root folder of run directories (relative: to the project)
out_dir: str = "reports/smith_kindermans"           # figures and tables go here (relative: to the project)
spec_path: Optional[str] = "experiments/smith_kindermans.yaml"  # the spec: which variant each run is
margin: float = 0.01                                # equivalence margin of the test, accuracy units (1 point)

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.findings.smith_kindermans import compare_schedules
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.plots.findings.smith_kindermans import curves_by_schedule
from bsresearch.sweep import variants
from bsresearch.sweep.spec import load_spec

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
spec = load_spec(project_path(spec_path))
rows = variants.runs_per_variant(runs, spec)
print(f"{len(rows)} runs:", dict(rows["state"].value_counts()), "| budget:", results.budget_description(rows))

# %% [markdown]
# ## The pre-registered test

# %%
test = compare_schedules(rows, "test_acc", margin=margin)
verdict = pd.DataFrame([{
    "statistic": "test accuracy, ramp - decay (points)", "estimate": 100 * test.diff,
    "95% Welch interval": f"[{100 * test.low:.2f}, {100 * test.high:.2f}]",
    "seeds (ramp, decay)": f"{test.n_ramp}, {test.n_decay}",
    "updates ramp / decay": f"{test.steps_ramp:.0f} / {test.steps_decay:.0f} = {test.steps_ratio:.2f}",
    "margin (points)": 100 * margin, "verdict": test.verdict}])
verdict.to_csv(out / "test.csv", index=False)
verdict.T

# %% [markdown]
# ## Secondary: final numbers per schedule, and the curves against epochs and against updates

# %%
ok = rows[rows["state"] == "ok"]
summary = stats.summarize(ok, "variant", ["test_acc", "train_loss", "test_loss", "steps"])
summary.to_csv(out / "summary.csv", index=False)
summary

# %%
history = results.load_history(ok, ["variant", "seed"])
fig, axes = plt.subplots(1, 3, figsize=(10.5, 3.2), layout="constrained")
curves_by_schedule(axes[0], history, "test_acc", "epoch")
curves_by_schedule(axes[1], history, "test_acc", "step")
curves_by_schedule(axes[2], history, "train_loss", "epoch")
axes[2].set_yscale("log")
save_figure(fig, out / "curves",
            "Test accuracy against epochs and against parameter updates, and train loss against epochs: lr decayed "
            "x0.2 at 50% and 75% of the epochs (decay) vs the batch grown x5 there (ramp). Lines: mean over "
            "seeds; bands: range over seeds.", runs=ok)
plt.show()
