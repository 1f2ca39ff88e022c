# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Goyal et al. (2017) on MNIST-1D: linear scaling with gradual warmup
#
# **Claim** (SCIENCE.md): with lr = base_lr x B / B_base and a gradual warmup (5 of 90 epochs), ResNet-50 on
# ImageNet keeps its error from B = 256 (23.60) to 8k (23.74); without warmup 24.84; without lr scaling
# 41.67; sqrt scaling 26.22; it breaks beyond 8k (16k 24.79, 32k 27.55, 64k 33.96).
#
# **Here** (`experiments/goyal.yaml`, every setting justified there): cnn1d with BatchNorm over ghost batches
# of 32 (Goyal's per-worker BN), SGD momentum 0.9, lr 0.05 at batch 32 (library default, not tuned), 36
# epochs for every batch size, step schedule x0.1 at 1/3, 2/3, 8/9; batch 32 to 4000 (full batch); rules:
# none, linear, linear + 2-epoch warmup, sqrt, sqrt + warmup; 3 seeds. MNIST-1D has 4000 training
# examples: B = 400 is already 10% of the data and B = 4000 gets 36 updates in all (Goyal's 8k is 0.6% of
# ImageNet, 14k updates).
#
# A rule *breaks* at a batch size where its mean test accuracy is more than `break_drop` below the same
# rule at `baseline_batch`, or a seed diverges (criterion fixed in the spec before the runs).

# %% tags=["parameters"]
from typing import Optional

sweep: str = "goyal"                               # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "runs"                             # root folder of run directories (relative: to the project)
out_dir: str = "reports/goyal"                     # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = "experiments/goyal.yaml"     # the spec: which rule (variant) each run belongs to
break_drop: float = 0.01                           # a rule breaks when its test accuracy falls this far ...
baseline_batch: int = 32                           # ... below its own value at this batch size
curve_rules: list = ["none", "linear", "linear_warmup", "sqrt_warmup"]  # rules shown in the training curves

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.findings import goyal
from bsresearch.findings.goyal import rule_vs_batch
from bsresearch.paths import project_path, require_sweep
from bsresearch.plots import figure_grid, learning_curves, save_figure
from bsresearch.sweep import variants
from bsresearch.sweep.spec import load_spec

runs_dir, out = project_path(runs_dir), project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)
require_sweep(sweep, runs_dir)
spec = load_spec(project_path(spec_path))
order = variants.variant_order(spec)
runs = results.load(sweep, runs_root=runs_dir)
rows = results.generalization_gap(variants.runs_per_variant(runs, spec))
unique = rows.drop_duplicates("run_id")            # for captions: each run counted once
print(f"{runs['run_id'].nunique()} runs ({len(rows)} rule x batch x seed rows; the batch-{baseline_batch} runs "
      f"are shared by the rules):", dict(runs["state"].value_counts()), "| budget:", results.budget_description(rows))
rows.pivot_table(index="variant", columns="batch_size", values="state", aggfunc=lambda s: (s == "diverged").sum()
                 ).loc[order].rename_axis("diverged seeds")

# %%
# per rule and batch size: mean, std and 95% t-interval over the seeds that finished, and the outcomes
metrics = ["test_acc", "train_acc", "gap_acc", "train_loss", "test_loss", "effective_lr", "steps", "train_seconds"]
table = stats.summarize_states(rows, ["variant", "batch_size"], metrics)
table["variant"] = pd.Categorical(table["variant"], order, ordered=True)
table = table.sort_values(["variant", "batch_size"]).reset_index(drop=True)
diff = goyal.versus_baseline_batch(rows, "test_acc", baseline_batch).rename(
    columns={"diff": "test_acc_vs_base", "low": "test_acc_vs_base_low", "high": "test_acc_vs_base_high"})
table = table.merge(diff[["variant", "batch_size", "test_acc_vs_base", "test_acc_vs_base_low",
                          "test_acc_vs_base_high"]], on=["variant", "batch_size"], how="left")
table.to_csv(out / "summary.csv", index=False)
shown = ["test_acc", "train_loss", "train_acc", "effective_lr"]
text = stats.markdown_table(table, ["variant", "batch_size"], shown, counts=("n", "n_diverged"))
(out / "summary.md").write_text(results.provenance_caption(unique) + "\n\n" + text)
print(text)

# %%
# where each rule breaks
verdict = goyal.breaking_batch(table, "test_acc", drop=break_drop, baseline_batch=baseline_batch)
verdict.to_csv(out / "breaking.csv", index=False)
verdict

# %%
# each rule minus linear + warmup at the same batch size (test accuracy, Welch 95% interval over seeds)
reference_rule = "linear_warmup" if "linear_warmup" in order else order[0]
versus_rule = stats.versus_within(rows, "test_acc", within="batch_size", compare="variant", reference=reference_rule)
versus_rule.to_csv(out / "versus_linear_warmup.csv", index=False)
cells = versus_rule.assign(text=lambda d: d.apply(
    lambda r: f"{100 * r['diff']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]", axis=1))
cells.pivot(index="variant", columns="batch_size", values="text").reindex(order).rename_axis(
    f"test acc minus {reference_rule} (pp)")

# %%
fig, axes = figure_grid(2, width=5.2, height=3.8)
rule_vs_batch(axes[0], rows, table, "test_acc", order=order)
base = table[(table["variant"] == "linear_warmup") & (table["batch_size"] == baseline_batch)]["test_acc_mean"]
if len(base):
    axes[0].axhline(float(base.iloc[0]) - break_drop, color="0.5", linestyle=":", linewidth=1)
rule_vs_batch(axes[1], rows, table, "train_loss", order=order, log_y=True)
axes[1].get_legend().remove()
save_figure(fig, out / "goyal_vs_batch",
            "Goyal et al. on MNIST-1D: final test accuracy (left) and full-train loss (right) against batch size "
            "at a fixed 36 epochs, per lr rule (lr 0.05 at batch 32; linear: x B/32, sqrt: x sqrt(B/32); "
            "warmup: 2 epochs). Mean and 95% t-interval over the seeds that finished (faint: each seed); x at "
            f"the bottom: a diverged seed. Dotted: {break_drop:g} below linear+warmup at batch {baseline_batch} "
            "(the breaking threshold).", runs=unique)
plt.show()

# %%
# training curves per rule: does the large batch follow the small batch's curve (Goyal's figure 2)?
ok = rows[rows["state"] == "ok"]
history = results.load_history(ok, ["variant", "batch_size", "seed"])
rules = [r for r in curve_rules if r in order]
fig, axes = figure_grid(len(rules), width=3.8, height=3.3)
for ax, rule in zip(axes, rules):
    learning_curves(ax, history[history["variant"] == rule], "train_loss", x="epoch", hue="batch_size",
                    log_x=False, errorbar=None)
    ax.set_title(rule, fontsize="medium")
    ax.legend(fontsize="x-small", title="batch size", title_fontsize="x-small")
save_figure(fig, out / "training_curves",
            "Full-train loss against epochs per lr rule, one line per batch size (mean over the seeds that "
            "finished; diverged runs are left out).", runs=ok.drop_duplicates("run_id"))
plt.show()

# %%
# the numbers the report cites: each rule at the largest batch where linear + warmup holds, and at 4000
lw = verdict.set_index("variant").loc["linear_warmup"] if "linear_warmup" in set(verdict["variant"]) else None
if lw is not None:
    print(f"linear + warmup: largest batch that holds {lw.largest_ok}, first broken {lw.first_broken} ({lw.why})")
t = table.set_index(["variant", "batch_size"])
for b in sorted(set(table["batch_size"])):
    cells = []
    for v in order:
        r = t.loc[(v, b)]
        diverged = f" ({int(r.n_diverged)} div)" if r.n_diverged else ""
        cells.append(f"{v} {r.test_acc_mean:.4f}+-{r.test_acc_std:.4f}" + diverged)
    print(f"B={b:5d}: " + " | ".join(cells))
