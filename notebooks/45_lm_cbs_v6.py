# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # The critical batch size by branching with an annealed reference, protocol v6
#
# docs/protocols.md#v6-cbs. Branches one octave apart on the wsd schedule from checkpoints of a constant-lr
# trunk; the reference's improvement is judged against the annealed loss at the checkpoint (a cooldown run), and a
# checkpoint is stalled only when an interval says so (`findings.lm_cbs.v6_cbs_test`). The EWA arm (constant lr,
# the weights averaged) is reported beside the verdict when the sweep has its runs (the GPU spec does; the CPU
# spec, lm_cbs_v6, runs the primary arms only: protocol version 6.7).

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_cbs_v6"                           # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_cbs_v6"                 # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/lm_cbs_v6.yaml"   # the spec: which variant each run belongs to

# %%
import matplotlib.pyplot as plt

from bsresearch import results
from bsresearch.findings import lm_cbs
from bsresearch.plots import save_figure
from bsresearch.plots.findings import lm_cbs as figures

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)

# %%
test = lm_cbs.v6_cbs_test(runs)
print(f"VERDICT (CBS by branching, protocol v6): {test.verdict.upper()} - {test.why}")
print(test.stalls.to_string(index=False))
test.stalls.to_csv(out / "stall.csv", index=False)
test.stall_seeds.to_csv(out / "stall_per_seed.csv", index=False)
table = lm_cbs.long_test_table(test.long).assign(verdict=str(test.verdict), problems=test.why)
table.to_csv(out / "test.csv", index=False)
test.cbs.to_csv(out / "cbs_per_seed.csv", index=False)
if test.ewa is not None:
    ewa = lm_cbs.test_table(test.ewa).assign(arm="EWA 0.999, constant lr (secondary)")
    ewa.to_csv(out / "secondary_ewa.csv", index=False)
    print(f"secondary, the EWA arm: D = {test.ewa.d:+.2f} [{test.ewa.d_low:+.2f}, {test.ewa.d_high:+.2f}], "
          f"G = {test.ewa.g:+.2f} [{test.ewa.g_low:+.2f}, {test.ewa.g_high:+.2f}]: {test.ewa.verdict}")
else:
    print("secondary, the EWA arm: no runs in this sweep (gpu_lm_cbs_v6.yaml has them, for a GPU)")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
figures.stall_vs_tokens((axes[0], axes[1]), test.stall_seeds, test.stalls, reference="L_cool(T0)")
fig.tight_layout()
caption = ("The stall criterion (protocol v6), computed on the annealed reference before the test: left, 1 - L_1(T0 + "
           "W) / L_cool(T0) per seed and its mean, against its 2% floor; right, the smallest L_k / L_1 over k >= 2 "
           "(against 0.995). A checkpoint is stalled only when the interval's upper end is below a floor. "
           f"Verdict: {test.verdict} ({test.why}).")
save_figure(fig, out / "stall", caption, runs=runs)
plt.show()

# %% [markdown]
# Beside the test, no verdict: the CBS's geometric mean over seeds (with its t interval) at each checkpoint, at the
# test's tolerance (0.01) and at 0.005 and 0.02, and the loss ratios it is read from.

# %%
tolerances = lm_cbs.cbs_by_tolerance(test.branches)
tolerances.to_csv(out / "cbs_by_tolerance.csv", index=False)
print(tolerances.pivot(index="checkpoint", columns="eps", values="cbs_gmean").round(1).to_string())
ratios = lm_cbs.loss_ratios(test.branches)
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for ax in axes:
    figures.ratio_vs_k(ax, ratios)
axes[1].set_ylim(0.995, 1.03)
axes[1].set_title("near the tolerance (larger ratios off the scale)", fontsize=9)
fig.tight_layout()
caption = ("L_k / L_1 of the wsd branches against k, per checkpoint (mean and 95% t interval over seeds); right, the "
           "same near the tolerance 1.01, where the CBS is read.")
save_figure(fig, out / "ratio_vs_k", caption, runs=runs)
plt.show()
