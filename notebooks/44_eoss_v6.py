# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # The edge of stochastic stability, protocol v6
#
# docs/protocols.md#v6-eoss. SGD at one lr eta (the rule's: the largest of 0.01-0.1 at which B = 1024 trains on
# every seed) over B = 8 ... 1024, measuring along training the full-batch top Hessian eigenvalue lambda_max and the
# batch sharpness. Pre-registered: the batch sharpness settles near 2/eta at every B (P1), lambda_max settles below
# it (P2) and the more so the smaller the batch (P3); Adam's preconditioned sharpness against 38/lr beside them (P4).

# %% tags=["parameters"]
from typing import Optional

sweep: str = "eoss_v6_mnist1d"                     # the sweep's name: its runs are in RUNS_DIR/SWEEP/
eta_sweep: str = "eoss_v6_mnist1d_eta"             # the lr rule's runs (batch 1024 at each eta); empty: in `sweep`
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/eoss_v6_mnist1d"           # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/eoss_v6_mnist1d.yaml"   # the spec: which variant each run belongs to
adam_lr: float = 0.001                             # the Adam arm's lr

# %%
import matplotlib.pyplot as plt

from bsresearch import results
from bsresearch.findings import eoss
from bsresearch.plots import save_figure
from bsresearch.plots.findings import eoss as figures

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir, also=eta_sweep)   # with the rule's runs
history = results.load_history(runs, ["optimizer", "lr", "batch_size", "seed"])
rule = eoss.eta_rule(runs, history)
print(f"lr rule: {rule.why}")
print(rule.table.to_string(index=False))
rule.table.to_csv(out / "eta_rule.csv", index=False)

# %%
test = eoss.eoss_test(runs, history, rule.eta, adam_lr)
print(f"VERDICT (edge of stochastic stability, protocol v6): {test.verdict.upper()} - {test.why}")
table = eoss.test_table(test)
table.to_csv(out / "test.csv", index=False)
print(table.drop(columns=["why", "verdict"]).to_string(index=False))
test.per_batch.to_csv(out / "per_batch.csv", index=False)
test.per_seed.to_csv(out / "per_seed.csv", index=False)
shown = ["arm", "batch_size", "seeds", "counted", "limit_ratio", "limit_ratio_low", "limit_ratio_high",
         "batch_limit_ratio", "batch_limit_ratio_low", "batch_limit_ratio_high", "precond_limit_ratio"]
print(test.per_batch[shown].to_string(index=False))

# %% [markdown]
# The batch sharpness here is the pre-registered one: the mean over mini-batches of each one's g' H g / |g|^2. Andreyev
# and Beneventano write it as a ratio of the two means over mini-batches, E[g' H g] / E[|g|^2], which weights the
# mini-batches with large gradients more; the runs record only the first, so the second is not computed here.

# %%
fig, ax = plt.subplots(figsize=(6, 4))
figures.settled_vs_batch(ax, test)
caption = ("Settled curvature (the mean over the last 30% of the measurement steps; mean and 95% t interval over "
           "seeds) as a fraction of its stability limit, against the batch size: SGD's batch sharpness and full-batch "
           f"lambda_max over 2/eta (eta {rule.eta:g}), Adam's preconditioned sharpness over 38/lr; grey: P1's band "
           f"[0.8, 1.2]; an interval that reaches 0 runs to the axis' bottom. The test: {test.why}. "
           f"Verdict: {test.verdict}.")
save_figure(fig, out / "settled_vs_batch", caption, runs=runs)
plt.show()

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
figures.along_training(axes[0], history, runs, rule.eta, "batch_sharpness")
figures.along_training(axes[1], history, runs, rule.eta, "sharpness")
caption = (f"Along training, SGD at eta {rule.eta:g}: the batch sharpness (left) and the full-batch lambda_max "
           "(right) over 2/eta, mean over seeds, one line per batch size; the black line is the limit. Early in "
           "training the batch sharpness is negative (the loss curves down along the first gradients): those "
           "points are off the log axis.")
save_figure(fig, out / "along_training", caption, runs=runs)
plt.show()
