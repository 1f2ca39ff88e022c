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
eta: float = 0.0                                   # SGD's lr, fixed by an earlier rule; 0: the lr rule picks it here
batch_column: str = "batch_sharpness"              # P1's statistic: batch_sharpness or batch_sharpness_pooled

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

eta = eta or rule.eta
print(f"SGD's lr: {eta:g}" + (" (the lr rule's)" if eta == rule.eta else " (fixed by an earlier version's rule)"))

# %%
test = eoss.eoss_test(runs, history, eta, adam_lr, batch_column=batch_column)
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
# P1 reads `batch_column`: version 6.1's pre-registered `batch_sharpness`, the mean over mini-batches of each one's
# g' H g / |g|^2, or `batch_sharpness_pooled`, the ratio of the two means over the same mini-batches,
# E[g' H g] / E[|g|^2], as Andreyev and Beneventano write it (it weights the mini-batches with large gradients more;
# runs record it since 2026-11-29, so the reports of versions 6.1 and 6.4 cannot compute it).

# %%
fig, ax = plt.subplots(figsize=(6, 4))
figures.settled_vs_batch(ax, test)
shown_as = eoss.BATCH_COLUMNS[batch_column]
caption = ("Settled curvature (the mean over the last 30% of the measurement steps; mean and 95% t interval over "
           f"seeds) as a fraction of its stability limit, against the batch size: SGD's {shown_as} and full-batch "
           f"lambda_max over 2/eta (eta {eta:g}), Adam's preconditioned sharpness over 38/lr; grey: P1's band "
           f"[0.8, 1.2]; an interval that reaches 0 runs to the axis' bottom. The test: {test.why}. "
           f"Verdict: {test.verdict}.")
save_figure(fig, out / "settled_vs_batch", caption, runs=runs)
plt.show()

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
figures.along_training(axes[0], history, runs, eta, batch_column)
figures.along_training(axes[1], history, runs, eta, "sharpness")
caption = (f"Along training, SGD at eta {eta:g}: the {shown_as} (left) and the full-batch lambda_max "
           "(right) over 2/eta, mean over seeds, one line per batch size; the black line is the limit. Early in "
           "training the batch sharpness is negative (the loss curves down along the first gradients): those "
           "points are off the log axis.")
save_figure(fig, out / "along_training", caption, runs=runs)
plt.show()
