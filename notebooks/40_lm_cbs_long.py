# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Merrill et al. 2025: the critical batch size by branching, longer and with a reference that has not stalled
#
# docs/protocols.md#lm-cbs-long (protocol v5). Windows T0/2, checkpoints 2^17 ... 2^23 tokens, reference batch 8.
# The stall criterion is computed on the reference first; the test (`findings.lm_cbs.long_cbs_test`) uses the
# checkpoints before the first stalled one.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_cbs_long"                         # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_cbs_long"               # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/lm_cbs_long.yaml"   # the spec: which variant each run belongs to

# %%
import matplotlib.pyplot as plt

from bsresearch import results
from bsresearch.findings import lm_cbs
from bsresearch.plots import deciding, save_figure
from bsresearch.plots.findings import lm_cbs as figures

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)

# %%
branches = lm_cbs.branch_losses(runs)
at_checkpoints = lm_cbs.checkpoint_losses(runs)
stalls = lm_cbs.stall_table(branches, at_checkpoints)
stalls.to_csv(out / "stall.csv", index=False)
stall_seeds = lm_cbs.stall_per_seed(branches, at_checkpoints)
stall_seeds.to_csv(out / "stall_per_seed.csv", index=False)
print(stalls.to_string(index=False))
cbs = lm_cbs.critical_batch_sizes(branches)
test = lm_cbs.long_cbs_test(cbs, stalls)
print(f"VERDICT (CBS by branching, protocol v5): {test.verdict.upper()} - {test.why}")
if test.last_used != test.last_planned:
    dropped = sorted(c for c in cbs["checkpoint"].unique() if not c <= test.last_used)
    print(f"checkpoints the test may not use (at or after the first stalled one): "
          f"{', '.join(f'{c:,.0f}' for c in dropped)} tokens")
# D and G on the checkpoints used (empty where a stall leaves none), with the verdict of the whole test
lm_cbs.long_test_table(test).to_csv(out / "test.csv", index=False)
cbs.to_csv(out / "cbs_per_seed.csv", index=False)
table = lm_cbs.cbs_by_checkpoint(cbs, runs)
table.to_csv(out / "cbs_by_checkpoint.csv", index=False)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
figures.cbs_vs_tokens(axes[0], table, cbs)
figures.ratio_vs_k(axes[1], lm_cbs.loss_ratios(branches))
caption = ("Left: the CBS by branching (geometric mean over seeds) and B_simple against tokens. Right: L_k / L_1 "
           "against k per checkpoint.")
save_figure(fig, out / "cbs_vs_tokens", caption, runs=runs)

# %% [markdown]
# The stall criterion, computed before the test: which checkpoints the test may use.

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
figures.stall_vs_tokens((axes[0], axes[1]), stall_seeds, stalls)
fig.tight_layout()
caption = ("The stall criterion (protocol v5), computed on the reference before the test: left, the reference's "
           "relative improvement over its window (each seed, and the mean the criterion reads, against its 2% floor); "
           "right, the smallest L_k / L_1 over the larger batches (against 0.995). A checkpoint whose mean falls below "
           "either floor is stalled (red), and the test uses only the checkpoints before the first stalled one.")
save_figure(fig, out / "stall", caption, runs=runs)

# %% [markdown]
# The deciding statistics, D and G, each with its interval and the band the verdict needs (from test.csv).

# %%
if test.test is not None:
    deciding.redraw("lm_cbs", out)
