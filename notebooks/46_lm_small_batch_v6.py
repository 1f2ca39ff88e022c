# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Marek et al. 2025: beta2 at batch 4 and 16 with each rule's lr held out, protocol v6
#
# docs/protocols.md#v6-beta2. Both beta2 rules (fixed, and the half-life in tokens) at batch 4 and 16, each on a
# 4-lr grid; every seed of each rule is taken at the lr best on the other seeds (`findings.lm_small_batch.held_out`).
# d_beta2(B) = L(fixed) - L(half-life), paired t 95% over 16 seeds. Version 5's test (1) is then recomputed with
# these rows in place of its own at 4 and 16, batch 1 kept from its committed per-seed table
# (`findings.lm_small_batch.beta2_v6_test`).

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_small_batch_v6"                   # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_small_batch_v6"         # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/lm_small_batch_v6.yaml"   # the spec: which variant each run belongs to
earlier: str = "reports/lm_small_batch_v5/per_seed.csv"   # version 5's per-seed d_beta2 (relative: to the project)

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results
from bsresearch.findings import lm_small_batch
from bsresearch.paths import project_path
from bsresearch.plots import save_figure

runs_dir, out, runs = results.start_report(sweep, runs_dir, out_dir)
before = pd.read_csv(project_path(earlier))

# %%
test = lm_small_batch.beta2_v6_test(runs, before)
print(f"VERDICT (version 5's test (1) with version 6's rows at 4 and 16): {test.verdict.upper()} - {test.why}")
print(test.per_batch.to_string(index=False))
# the effect each batch size's seeds detect with 80% power at version 5's per-seed sd (the protocol's power table)
detectable = lm_small_batch.detectable_by_batch(test, before)
for _, row in detectable.iterrows():
    print(f"batch {row['batch_size']}: {row['n']} seeds detect |d_beta2| >= {row['detectable']:.3f} nats with 80% "
          f"power at version 5's sd {row['sd_v5']:.3f}; held-out lrs: fixed {row['lr_fixed']}, half-life "
          f"{row['lr_half_life']}")
detectable.to_csv(out / "power.csv", index=False)
test.per_batch.to_csv(out / "beta2_by_batch.csv", index=False)
test.rows.per_seed.assign(statistic="d_beta2", a_is="adam_fixed", b_is="adam_half_life") \
    .to_csv(out / "per_seed.csv", index=False)
pd.DataFrame([{"test": "beta2", "verdict": test.verdict, "why": test.why}]).to_csv(out / "test.csv", index=False)
pd.concat([lm_small_batch.lr_grid_table(runs, setting, int(b))
           for setting in ("adam_fixed", "adam_half_life") for b in sorted(runs["batch_size"].unique())],
          ignore_index=True).to_csv(out / "lr_grid.csv", index=False)   # each cell's grid, lr by lr

# %%
fig, ax = plt.subplots(figsize=(6, 4))
for source, marker in (("version 5", "s"), ("version 6", "o")):
    per = test.per_batch[test.per_batch["source"] == source]
    ax.errorbar(per["batch_size"], per["diff"], yerr=[per["diff"] - per["low"], per["high"] - per["diff"]],
                marker=marker, ls="none", capsize=3, label=source)
ax.axhline(0, color="k", lw=1)
ax.set(xscale="log", xlabel="batch size", ylabel="L(fixed) - L(half-life) (nats)",
       title=f"beta2 half-life against fixed (v6): {test.verdict}")
ax.legend(fontsize=8)
caption = ("Deciding statistic of version 5's test (1) recomputed under version 6: L(fixed beta2) - L(half-life "
           "beta2), the final validation loss, mean and paired t 95% interval over seeds; batch 4 and 16 from version "
           "6's runs (each seed at its held-out lr, 16 seeds), batch 1 from version 5's committed per-seed table; "
           f"above 0: the half-life rule is better. Verdict: {test.verdict} ({test.why}).")
save_figure(fig, out / "beta2_by_batch", caption, runs=runs)
