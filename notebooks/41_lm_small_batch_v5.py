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
# the fixed one at batch 1, 4 and 16 (each >= 1000 updates), and at 64 from the GPU spec when its runs are there (64
# cannot get 1000 updates on this CPU budget). (2) `sgd_test`: plain SGD at batch 1 at its held-out best lr against
# Adam. Per-seed values of both paired statistics: per_seed.csv.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_small_batch_v5"                   # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_small_batch_v5"         # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/lm_small_batch_v5.yaml"   # the spec: which variant each run belongs to
sgd_sweep: str = "lm_small_batch_sgd_v5"            # the SGD runs of test (2)
# the grids extended at their edges, the seeds extended (protocol rules) and batch 64 on a GPU, read with the two
# sweeps above (a sweep not run yet is skipped)
extension_sweeps: str = ("lm_small_batch_sgd_v5_ext,lm_small_batch_v5_seeds,lm_small_batch_sgd_v5_seeds,"
                         "gpu_lm_small_batch_v5")

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results
from bsresearch.findings import lm_small_batch
from bsresearch.plots import save_figure

runs_dir, out, runs = results.start_report([sweep, sgd_sweep], runs_dir, out_dir, also=extension_sweeps)
extra = [s for s in dict.fromkeys(runs["sweep"]) if s not in (sweep, sgd_sweep)]   # the extensions run
print("sweeps read:", ", ".join([sweep, sgd_sweep, *extra]))
if "gpu_lm_small_batch_v5" not in extra:
    print("batch 64 (256 updates at 2^21 tokens) is left to experiments/gpu_lm_small_batch_v5.yaml (1024 updates on a"
          " GPU), not run yet; batch 256, the half-life rule's reference, is the same configuration under both rules")

# %%
beta2 = lm_small_batch.beta2_by_batch_test(runs)
sgd = lm_small_batch.sgd_test(runs, batch_size=1)
print(f"VERDICT (1) beta2 at every batch size: {beta2.verdict.upper()} - {beta2.why}")
print(f"VERDICT (2) SGD at batch 1: {sgd.verdict.upper()} - {sgd.why}")
print(beta2.per_batch.to_string(index=False))
print(f"SGD at batch 1: best lr {sgd.best_lr:g} on all seeds, held out per seed {sgd.held_out_lrs}; gap "
      f"{sgd.gap.diff:+.4f} [{sgd.gap.low:+.4f}, {sgd.gap.high:+.4f}] nats, "
      f"threshold +{sgd.margin * sgd.reference:.4f}")
beta2.per_batch.to_csv(out / "beta2_by_batch.csv", index=False)
lm_small_batch.lr_grid_table(runs, "sgd", sgd.batch_size).to_csv(out / "sgd_lr_grid.csv", index=False)   # per lr
pd.concat([beta2.per_seed.assign(statistic="d_beta2", a_is="adam_fixed", b_is="adam_half_life"),
           sgd.per_seed.assign(statistic="sgd_gap", batch_size=sgd.batch_size, a_is="sgd", b_is="adam_half_life")],
          ignore_index=True).to_csv(out / "per_seed.csv", index=False)
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
caption = ("Deciding statistic of test (1): L(fixed beta2) - L(half-life beta2), the final validation loss, at each "
           "batch size; mean and paired t 95% interval over seeds (per_seed.csv); above 0: the half-life rule is "
           "better.")
save_figure(fig, out / "beta2_by_batch", caption, runs=runs)

# %% [markdown]
# SGD at batch 1 over its lr grid (every seed, a run not ok drawn at the top), with Adam (half-life) at batch 1:
# test (2)'s gap is SGD at each seed's held-out lr minus Adam, against 1% of Adam's loss.

# %%
data = runs.assign(setting=lm_small_batch.settings(runs))
sgd_runs = data[(data["setting"] == "sgd") & (data["batch_size"] == 1)]
loss = pd.to_numeric(sgd_runs["test_loss"], errors="coerce").where(sgd_runs["state"].eq("ok"))
top = float(loss.max()) * 1.05 if loss.notna().any() else 5.0
fig, ax = plt.subplots(figsize=(6, 4))
ax.scatter(sgd_runs["lr"], loss.fillna(top), c=loss.isna().map({True: "tab:red", False: "tab:blue"}), s=14)
ax.axhline(sgd.reference, color="k", lw=1, label="Adam (half-life), batch 1, mean")
ax.axhline(sgd.reference * (1 + sgd.margin), color="k", lw=1, ls="--", label="+1%: the competitive threshold")
ax.set(xscale="log", xlabel="SGD lr (at batch 4; x sqrt(B/4))", ylabel="final validation loss (nats)",
       title=f"SGD at batch 1: {sgd.verdict}")
ax.legend(fontsize=8)
caption = (f"SGD (momentum 0) at batch 1, final validation loss of every run over its lr grid (red: not ok, drawn at "
           f"the top); lines: Adam (half-life) at batch 1 and 1% above it. Test (2)'s gap at the held-out lr: "
           f"{sgd.gap.diff:+.3f} [{sgd.gap.low:+.3f}, {sgd.gap.high:+.3f}] nats, paired t 95% over seeds.")
save_figure(fig, out / "sgd_lr", caption, runs=runs)
