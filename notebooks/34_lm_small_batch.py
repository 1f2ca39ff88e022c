# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 34 · Small batches for language models: Marek, Lotfi, Somasundaram, Wilson & Goldblum (2025)
#
# **Claim.** Down to batch size 1, language models train stably and as well per token as at large batches if
# Adam's beta2 keeps a fixed half-life in tokens (beta2 at batch B' = beta2^(B'/B)); with the large-batch beta2
# small batches do worse; plain SGD is competitive at small batches; gradient accumulation is wasteful.
#
# **Here** (`experiments/lm_small_batch*.yaml`, every setting justified there): the language-model example
# (examples/lm.py, 0.11 M parameters), batch 1 ... 256 sequences at 2^21 tokens each, Adam with beta2 0.95 fixed
# or at a fixed half-life (0.95 at batch 256), plain SGD; the lr chosen per cell on seeds 1-2, the test on
# seeds 3-7 at that lr.
#
# **Pre-registered test** (docs/protocols.md#lm-small-batch): d_beta2 = L(fixed, B=1) - L(half-life, B=1) and
# d_small = L(half-life, B=1) - L(half-life, B=256), paired t over seeds 3-7; reproduced when d_beta2's interval
# lies above 0 and d_small's upper end is at most 1% of L(half-life, B=256).

# %% tags=["parameters"]
from typing import Optional

sweep: str = "lm_small_batch"               # the Adam lr selection (seeds 1-2)
sgd_sweep: str = "lm_small_batch_sgd"       # the SGD lr selection (seeds 1-2); "" for none
extension_sweeps: str = "lm_small_batch_ext,lm_small_batch_sgd_ext"   # grids extended at their edges (the
                                            # protocol's rule), comma-separated; those not run yet are skipped
seeds_sweep: str = "lm_small_batch_seeds,lm_small_batch_sgd_seeds"   # seeds 3-7 at the chosen lrs, Adam and
                                            # SGD, comma-separated (those not run yet are skipped)
runs_dir: str = "runs"                      # root folder of run directories (relative: to the project)
out_dir: str = "reports/lm_small_batch"     # figures and tables go here (relative: to the project)
spec_path: Optional[str] = None             # the spec (not needed: a run's setting is read from its config)

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import display

from bsresearch import results
from bsresearch.findings.lm_small_batch import (
    by_batch,
    per_seed,
    secondary,
    seeds_overrides,
    select_lr,
    small_batch_test,
)
from bsresearch.plots import save_figure
from bsresearch.plots.findings.lm_small_batch import loss_vs_batch, spread_vs_batch

runs_dir, out, selection_runs = results.start_report([s for s in (sweep, sgd_sweep) if s], runs_dir, out_dir,
                                                     also=extension_sweeps)
seeds_sweeps = results.sweeps_run(seeds_sweep, runs_dir)
if not seeds_sweeps:
    print("no seeds sweep has run: the lr selection only")

# %% [markdown]
# ## The lr selection (seeds 1-2) and the seeds spec's overrides

# %%
selection = select_lr(selection_runs)
selection.to_csv(out / "lr_selection.csv", index=False)
display(selection)
edges = selection[selection["edge"] != ""]
print("best lr at an edge of its grid (the protocol extends these once):",
      "none" if edges.empty else ", ".join(f"{r.setting} B={r.batch_size} ({r.edge})" for r in edges.itertuples()))
print(seeds_overrides(selection))

# %% [markdown]
# ## The pre-registered test (seeds 3-7 at the chosen lrs)

# %%
if seeds_sweeps:
    runs = results.load(seeds_sweeps, runs_root=runs_dir)
    test = small_batch_test(runs)
    verdict = pd.DataFrame([{
        "statistic 1": f"d_beta2 = L(adam fixed, B={test.small}) - L(adam half-life, B={test.small})",
        "estimate 1": round(test.d_beta2.diff, 4),
        "low 1": round(test.d_beta2.low, 4), "high 1": round(test.d_beta2.high, 4),   # 95% paired t
        "statistic 2": f"d_small = L(adam half-life, B={test.small}) - L(adam half-life, B={test.large})",
        "estimate 2": round(test.d_small.diff, 4),
        "low 2": round(test.d_small.low, 4), "high 2": round(test.d_small.high, 4), "seeds": test.d_beta2.n,
        "threshold": f"interval 1 above 0; upper end 2 <= {test.margin:g} x {test.reference:.4f} "
                     f"= {test.margin * test.reference:.4f}",
        "verdict": test.verdict, "problems": "; ".join(test.problems) or "none"}])
    verdict.to_csv(out / "test.csv", index=False)
    display(verdict.T)
    # every paired statistic's per-seed values (test.csv's and secondary.csv's), so each can be recomputed
    seeds = per_seed(runs)
    seeds.to_csv(out / "per_seed.csv", index=False)
    display(seeds)
    table = by_batch(runs)
    table.to_csv(out / "by_batch.csv", index=False)
    display(table)
    more = secondary(runs)
    more.to_csv(out / "secondary.csv", index=False)
    display(more)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
if seeds_sweeps:
    loss_vs_batch(axes[0], table, unit=results.loss_unit(runs))
spread_vs_batch(axes[1], selection)
save_figure(fig, out / "loss_vs_batch",
            "Left: final validation loss after 2^21 tokens against the batch size, per optimizer setting, each at "
            "its lr chosen on seeds 1-2; mean over seeds 3-7 with its 95% t interval. Right: the spread of the "
            "selection seeds' mean loss over each cell's lr grid (robustness to the lr).",
            runs=runs if seeds_sweeps else selection_runs)
plt.show()
