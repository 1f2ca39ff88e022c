# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Marek et al. 2025: beta2 at every batch size, SGD around its old edge (protocol v5)
#
# docs/protocols.md#lm-small-batch-v5. (1) `findings.lm_small_batch.beta2_by_batch_test`: the half-life beta2 against
# the fixed one at batch 1, 4 and 16 (each >= 1000 updates; 64 and 256 cannot be on this CPU budget and go to the
# GPU). (2) `sgd_test`: plain SGD at batch 1 at its held-out best lr against Adam.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_small_batch_v5"                   # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_small_batch_v5"         # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/lm_small_batch_v5.yaml"   # the spec: which variant each run belongs to
sgd_sweep: str = "lm_small_batch_sgd_v5"            # the SGD runs of test (2)
# the grids extended at their edges and the seeds extended (protocol rules), read with the two sweeps above (a sweep
# not run yet is skipped)
extension_sweeps: str = "lm_small_batch_sgd_v5_ext,lm_small_batch_v5_seeds,lm_small_batch_sgd_v5_seeds"

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results
from bsresearch.findings import lm_small_batch
from bsresearch.paths import project_path
from bsresearch.plots import save_figure

runs_dir, out = project_path(runs_dir), project_path(out_dir)
out.mkdir(parents=True, exist_ok=True)
runs = results.load(sweep, runs_root=runs_dir)
runs = pd.concat([runs, results.load([sgd_sweep, *results.sweeps_run(extension_sweeps, runs_dir)],
                                     runs_root=runs_dir)], ignore_index=True)
print(f"{len(runs)} runs:", dict(runs["state"].value_counts()))
print("batch sizes left to the GPU spec (fewer than 1000 updates at 2^21 tokens): 64, 256")

# %%
beta2 = lm_small_batch.beta2_by_batch_test(runs)
sgd = lm_small_batch.sgd_test(runs, batch_size=1)
print(f"VERDICT (1) beta2 at every batch size: {beta2.verdict.upper()} - {beta2.why}")
print(f"VERDICT (2) SGD at batch 1: {sgd.verdict.upper()} - {sgd.why}")
beta2.per_batch.to_csv(out / "beta2_by_batch.csv", index=False)
pd.DataFrame([{"test": "beta2", "verdict": beta2.verdict, "why": beta2.why},
              {"test": "sgd", "verdict": sgd.verdict, "why": sgd.why, "best_lr": sgd.best_lr,
               "gap": sgd.gap.diff, "low": sgd.gap.low, "high": sgd.gap.high}]).to_csv(out / "test.csv", index=False)

# %%
fig, ax = plt.subplots(figsize=(6, 4))
per = beta2.per_batch
ax.errorbar(per["batch_size"], per["diff"], yerr=[per["diff"] - per["low"], per["high"] - per["diff"]],
            marker="o", capsize=3)
ax.axhline(0, color="k", lw=1)
ax.set(xscale="log", xlabel="batch size", ylabel="L(fixed) - L(half-life) (nats)",
       title=f"beta2 half-life against fixed: {beta2.verdict}")
caption = ("L(fixed beta2) - L(half-life beta2) at each batch size, paired t 95% over seeds; above 0: the "
           "half-life rule is better.")
save_figure(fig, out / "beta2_by_batch", caption)
