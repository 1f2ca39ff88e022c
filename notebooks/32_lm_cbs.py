# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 32 · The critical batch size measured by branching: Merrill, Arora, Groeneveld & Hajishirzi (2025)
#
# **Claim.** Branch from checkpoints of one run into short continuations at k times the batch (the lr
# rescaled) and compare their loss after the same tokens with the original batch size's: the critical batch
# size (CBS) is the largest batch that keeps up. It is near 0 at initialization, rises fast, then plateaus;
# the gradient noise scale is a proxy resting on assumptions.
#
# **Here** (`experiments/lm_cbs.yaml`, every setting justified there): the language-model example
# (examples/lm.py, 0.11 M parameters, Debian's fortunes text), a trajectory at batch 4 with Adam, checkpoints at
# 2^13 ... 2^21 tokens, branches at batches 4 ... 256 (lr x sqrt(k)) for 2^19 tokens each, B_simple measured at
# the same checkpoints. 5 seeds. Any model: swap the spec's model, dataset and loss.
#
# **Pre-registered test** (docs/protocols.md#lm-cbs): D = log2 CBS(last) - log2 CBS(first) and G = log2 CBS(last)
# - log2 CBS(the checkpoint before), paired t over seeds; reproduced when D's interval lies above 0 and G's upper
# end is below 1.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_cbs"                       # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                      # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_cbs"             # figures and tables go here (relative: to the project)
spec_path: Optional[str] = None             # the spec (not needed: a branch is read from its own config)
eps: float = 0.01                           # the pre-registered tolerance: a branch 1% worse still keeps up

# %%
import matplotlib.pyplot as plt
from IPython.display import display

from bsresearch import results
from bsresearch.findings import lm_cbs
from bsresearch.findings.lm_cbs import branch_losses, cbs_by_checkpoint, cbs_test, critical_batch_sizes, loss_ratios
from bsresearch.plots import save_figure
from bsresearch.plots.findings.lm_cbs import cbs_vs_tokens, ratio_vs_k

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
print("loss unit:", results.loss_unit(runs))

# %% [markdown]
# ## The pre-registered test

# %%
branches = branch_losses(runs)
cbs = critical_batch_sizes(branches, eps=eps)
test = cbs_test(cbs)
verdict = lm_cbs.test_table(test)
verdict.to_csv(out / "test.csv", index=False)
display(verdict.T)

# %% [markdown]
# ## The CBS and B_simple at each checkpoint

# %%
table = cbs_by_checkpoint(cbs, runs)
table.to_csv(out / "cbs_by_checkpoint.csv", index=False)
cbs.to_csv(out / "cbs_per_seed.csv", index=False)
display(table)
ratios = loss_ratios(branches)
ratios.to_csv(out / "loss_ratios.csv", index=False)
for other in (0.005, 0.02):   # secondary: the CBS at other tolerances
    alt = cbs_by_checkpoint(critical_batch_sizes(branches, eps=other))
    print(f"eps {other:g}: CBS geometric means", [round(v, 1) for v in alt["cbs_gmean"]])

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
cbs_vs_tokens(axes[0], table, cbs)
ratio_vs_k(axes[1], ratios, eps)
save_figure(fig, out / "cbs_vs_tokens",
            f"Left: the critical batch size measured by branching (largest batch whose validation loss after the "
            f"window is within {eps:g} of the original batch's, relative) and B_simple measured exactly on the first "
            "training examples, against the tokens trained at the checkpoint; intervals are 95% t over seeds "
            "(CBS on log2). Right: loss after the window relative to k = 1, mean over seeds, per checkpoint.",
            runs=runs)
plt.show()
