# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 33 · Batch-size warmup: Merrill, Arora, Groeneveld & Hajishirzi (2025)
#
# **Claim.** The critical batch size starts small and grows, so a run can start at a small batch and grow it as
# the CBS allows: on OLMo 1B, slightly better loss than the original run with 43% fewer gradient steps.
#
# **Here** (`experiments/lm_batch_warmup.yaml`, every setting justified there): the language-model example
# (examples/lm.py), 2^22 tokens per run: batch 4 throughout (`small`), the CBS plateau throughout (`large`), and a
# warmup whose batch at each checkpoint is the CBS measured there by `lm_cbs` (the rule was fixed before lm_cbs
# ran). 5 seeds.
#
# **Pre-registered test** (docs/protocols.md#lm-batch-warmup): final validation loss, warmup minus small and
# warmup minus large, paired t over seeds; reproduced when warmup is no worse than small (upper end <= 1% of
# its loss), better than large (interval below 0), with fewer steps.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_batch_warmup"              # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                      # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_batch_warmup"    # figures and tables go here (relative: to the project)
spec_path: Optional[str] = None             # the spec (not needed: a run's schedule is read from its config)

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from bsresearch import results
from bsresearch.findings.lm_batch_warmup import loss_curves, per_seed, schedules, steps_to_reach, warmup_test
from bsresearch.plots import save_figure
from bsresearch.plots.findings.lm_batch_warmup import loss_vs

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
print("loss unit:", results.loss_unit(runs))

# %% [markdown]
# ## The pre-registered test

# %%
test = warmup_test(runs)
verdict = pd.DataFrame([{
    "statistic 1": "L(warmup) - L(small)", "estimate 1": round(test.d_small, 4),
    "low 1": round(test.d_small_low, 4), "high 1": round(test.d_small_high, 4),   # 95% paired t
    "statistic 2": "L(warmup) - L(large)", "estimate 2": round(test.d_large, 4),
    "low 2": round(test.d_large_low, 4), "high 2": round(test.d_large_high, 4),
    "steps, warmup / small": round(test.steps_fraction, 3), "seeds": test.n_seeds,
    "threshold": f"upper end 1 <= 1% of {test.small_loss:.4f}; interval 2 below 0; fewer steps",
    "verdict": test.verdict, "problems": "; ".join(test.problems) or "none"}])
verdict.to_csv(out / "test.csv", index=False)
display(verdict.T)
# the per-seed losses and paired differences the two intervals are computed from (so they can be recomputed)
seeds = per_seed(runs)
seeds.to_csv(out / "per_seed.csv", index=False)
display(seeds)

# %% [markdown]
# ## Secondary: the curves, and the steps each schedule needs to reach the small batch's final loss

# %%
table = runs.assign(schedule=schedules(runs)).groupby("schedule")[["test_loss", "steps"]].agg(["mean", "std"])
table.to_csv(out / "by_schedule.csv")
display(table)
curves = loss_curves(results.load_history(runs), runs)
reach = steps_to_reach(curves, float(runs.loc[schedules(runs) == "small", "test_loss"].mean()))
reach.to_csv(out / "steps_to_small_final_loss.csv", index=False)
display(reach.groupby("schedule")["step"].describe())

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
unit = results.loss_unit(runs)
loss_vs(axes[0], curves, "tokens", unit=unit)
loss_vs(axes[1], curves, "step", unit=unit)
save_figure(fig, out / "loss_vs_tokens_and_steps",
            "Validation loss against tokens trained (left) and optimizer steps (right): batch 4 throughout (small), "
            "the CBS plateau throughout (large), and batch-size warmup following the CBS measured by branching "
            "(lm_cbs); one line per seed.", runs=runs)
plt.show()
