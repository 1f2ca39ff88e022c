"""Regenerates notebooks/21_hoffer.ipynb and notebooks/22_goyal.ipynb (no outputs).

    .venv/bin/python notebooks/build_recipes.py
"""
from pathlib import Path

from nbbuild import code, md, write


def cells(spec):
    """("md" | "code", text, *tags) tuples -> notebook cells."""
    return [md(text) if kind == "md" else code(text, tags) for kind, text, *tags in spec]


HOFFER = [
("md", """
# Hoffer et al. (2017) on MNIST-1D: train longer, generalize better

**Claim** (SCIENCE.md): the large-batch generalization gap closes with sqrt lr scaling, ghost batch norm
(BatchNorm statistics over ghost batches, 128 in the paper) and "regime adaptation" (as many updates as
the small batch, the schedule stretched with them); the distance from initialisation grows like log(t).

**Here** (`experiments/hoffer.yaml`, every setting justified there): cnn1d with BatchNorm, SGD momentum
0.9, lr 0.05 at batch 32 (library default, not tuned), step schedule x0.1 at 1/3, 2/3, 8/9 of the run.
SB = 32 for 18 epochs against LB = 1000 under all 8 combinations of sqrt scaling (`sqrt`), ghost BN of
32 (`gbn`) and regime adaptation (`ra`: 2250 steps = SB's number of updates); 3 seeds each.
This notebook writes `variants.csv/.md` (per variant), `versus_sb.csv` (each variant minus SB, Welch
interval), `ingredient_effects.csv` (each ingredient added with the others fixed), `distance_fits.csv`
(log-t fits; per run in `distance_fits_per_run.csv`) and the figures.
"""),
("code", '''
from typing import Optional

sweep: str = "hoffer"                              # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "../runs"                          # root folder of run directories
out_dir: str = "../reports/hoffer"                 # figures and tables are written here
spec_path: Optional[str] = "../experiments/hoffer.yaml"  # the spec: which variant each run belongs to
reference: str = "sb"                              # the small-batch variant every other is compared with
fit_t_min: float = 10.0                            # first step of the distance fit (skips the first updates)
''', "parameters"),
("code", '''
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.findings import goyal, hoffer
from bsresearch.sweep import variants
from bsresearch.plots import figure_grid, learning_curves, save_figure
from bsresearch.findings.hoffer import distance_vs_steps, variant_points
from bsresearch.plots.sweeps import variant_colors
from bsresearch.sweep.spec import load_spec

out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
spec = load_spec(spec_path)
order = variants.variant_order(spec)
colors = variant_colors(order)                     # one colour per variant in every figure
runs = results.load(sweep, runs_root=runs_dir)
rows = results.generalization_gap(variants.runs_per_variant(runs, spec))
ok = rows[rows["state"] == "ok"]
print(f"{len(rows)} runs:", dict(rows["state"].value_counts()), "| budget:", results.budget_description(rows))
'''),
("code", '''
# per variant: mean, std and 95% t-interval over seeds
metrics = ["test_acc", "train_acc", "gap_acc", "train_loss", "test_loss", "gap_loss", "steps", "epochs",
           "effective_lr", "distance_from_init", "train_seconds"]
table = stats.summarize_states(rows, "variant", metrics).set_index("variant").loc[order].reset_index()
table.to_csv(out / "variants.csv", index=False)
shown = ["test_acc", "train_acc", "gap_acc", "train_loss", "steps", "effective_lr", "distance_from_init"]
(out / "variants.md").write_text(results.provenance_caption(rows) + "\\n\\n"
                                 + stats.markdown_table(table, ["variant"], shown, counts=("n", "n_diverged")))
print(stats.markdown_table(table, ["variant"], shown, counts=("n", "n_diverged")))
'''),
("code", '''
# each variant minus the small batch (Welch 95% interval over seeds): has the gap closed?
versus = pd.concat([stats.versus_reference(rows, m, {"variant": reference}).assign(metric=m)
                    for m in ["test_acc", "gap_acc", "train_loss"]], ignore_index=True)
versus.to_csv(out / "versus_sb.csv", index=False)
versus.pivot(index="variant", columns="metric", values=["diff", "low", "high"]).reindex(order).dropna(how="all").round(4)
'''),
("code", '''
# each ingredient's effect with the others held fixed: the LB variants form a 2^3 factorial design
lb_variants = [v for v in order if v != reference]
effects = pd.concat([hoffer.ingredient_effects(rows, m, lb_variants).assign(metric=m)
                     for m in ["test_acc", "gap_acc", "distance_from_init"]], ignore_index=True)
effects.to_csv(out / "ingredient_effects.csv", index=False)
effects[effects["metric"] == "test_acc"].round(4)
'''),
("code", '''
fig, axes = figure_grid(2, width=4.6, height=3.6)
variant_points(axes[0], rows, table, "test_acc", order=order)
variant_points(axes[1], rows, table, "gap_acc", order=order)
axes[1].set_yticklabels([])
save_figure(fig, out / "test_acc_and_gap",
            "Hoffer et al. on MNIST-1D: final test accuracy (left) and generalization gap, train minus test "
            "accuracy (right), per variant: sb = batch 32; lb = batch 1000 with sqrt lr scaling (sqrt), ghost "
            "BatchNorm over 32 examples (gbn), regime adaptation to SB's 2250 updates (ra). Mean and 95% "
            "t-interval over seeds, seeds as grey points.", runs=rows)
plt.show()
'''),
("md", """
## Distance from initialisation against log(steps)

Hoffer et al. argue that the weights diffuse "ultra-slowly", |w_t - w_0| ~ log t, so a large batch that
takes fewer updates cannot travel as far. We fit d = a + b ln t per run over the steps from `fit_t_min`
to the end of the first (constant) lr phase, and, as the alternative, d = c t^alpha (a random walk at a
fixed step size has alpha = 1/2); both R^2 are computed on d.
"""),
("code", '''
history = results.load_history(ok, ["variant", "batch_size", "seed", "lr_scaling", "ghost_batch_size", "budget"])
fits = hoffer.distance_fits(history, by=("variant", "seed"), t_min=fit_t_min)
fits.to_csv(out / "distance_fits_per_run.csv", index=False)
fit_table = stats.summarize(fits, "variant", ["slope", "intercept", "r2", "alpha", "r2_power", "t_max", "n_points"])
fit_table = fit_table.set_index("variant").loc[[v for v in order if v in set(fit_table["variant"])]].reset_index()
fit_table.to_csv(out / "distance_fits.csv", index=False)
print(stats.markdown_table(fit_table, ["variant"], ["slope", "r2", "alpha", "r2_power", "t_max"]))
'''),
("code", '''
same_epochs = [v for v in order if not v.endswith("_ra")]
same_updates = [v for v in order if v == reference or v.endswith("_ra")]
fig, axes = figure_grid(2, width=5.2, height=3.8)
distance_vs_steps(axes[0], history, fits, order=same_epochs, colors=colors)
axes[0].set_title("same epochs (18)", fontsize="medium")
distance_vs_steps(axes[1], history, fits, order=same_updates, colors=colors)
axes[1].set_title("same updates (2250): regime adaptation", fontsize="medium")
save_figure(fig, out / "distance_vs_log_steps",
            "Distance from initialisation |w_t - w_0| (all parameters, L2) against optimizer steps on a log "
            "axis: mean over seeds (band: range over seeds); dashed: d = a + b ln t fitted per run from step "
            f"{fit_t_min:g} to the first lr decay (mean of the seeds' fits; mean R^2 in the legend).", runs=ok)
plt.show()
'''),
("code", '''
# learning curves of the main steps of the recipe (all variants are in the tables)
main = [v for v in [reference, "lb", "lb_sqrt_gbn", "lb_ra", "lb_sqrt_gbn_ra"] if v in order]
curves = history[history["variant"].isin(main)]
fig, axes = figure_grid(2, width=5.0, height=3.6)
learning_curves(axes[0], curves, "train_loss", hue="variant", palette=colors)
learning_curves(axes[1], curves, "test_acc", hue="variant", log_y=False, palette=colors)
save_figure(fig, out / "learning_curves",
            "Full-train loss and test accuracy against optimizer steps for SB, LB, LB + sqrt + ghost BN, LB + "
            "regime adaptation and the whole recipe; mean and 95% interval over seeds.", runs=ok)
plt.show()
'''),
("code", '''
# the numbers the report cites
t = table.set_index("variant")
for v in order:
    r = t.loc[v]
    print(f"{v:16s} test_acc {r.test_acc_mean:.4f} +- {r.test_acc_std:.4f}  gap {r.gap_acc_mean:+.4f}  "
          f"train_loss {r.train_loss_mean:.4f}  steps {r.steps_mean:.0f}  (n={r.n}, diverged {r.n_diverged})")
'''),
]

GOYAL = [
("md", """
# Goyal et al. (2017) on MNIST-1D: linear scaling with gradual warmup

**Claim** (SCIENCE.md): with lr = base_lr x B / B_base and a gradual warmup (5 of 90 epochs), ResNet-50 on
ImageNet keeps its error from B = 256 (23.60) to 8k (23.74); without warmup 24.84; without lr scaling
41.67; sqrt scaling 26.22; it breaks beyond 8k (16k 24.79, 32k 27.55, 64k 33.96).

**Here** (`experiments/goyal.yaml`, every setting justified there): cnn1d with BatchNorm over ghost batches
of 32 (Goyal's per-worker BN), SGD momentum 0.9, lr 0.05 at batch 32 (library default, not tuned), 36
epochs for every batch size, step schedule x0.1 at 1/3, 2/3, 8/9; batch 32 to 4000 (full batch); rules:
none, linear, linear + 2-epoch warmup, sqrt, sqrt + warmup; 3 seeds. MNIST-1D has 4000 training
examples: B = 400 is already 10% of the data and B = 4000 gets 36 updates in all (Goyal's 8k is 0.6% of
ImageNet, 14k updates).

A rule *breaks* at a batch size where its mean test accuracy is more than `break_drop` below the same
rule at `baseline_batch`, or a seed diverges (criterion fixed in the spec before the runs).
"""),
("code", '''
from typing import Optional

sweep: str = "goyal"                               # the sweep's name: its runs are in RUNS_DIR/SWEEP/
runs_dir: str = "../runs"                          # root folder of run directories
out_dir: str = "../reports/goyal"                  # figures and tables are written here
spec_path: Optional[str] = "../experiments/goyal.yaml"  # the spec: which rule (variant) each run belongs to
break_drop: float = 0.01                           # a rule breaks when its test accuracy falls this far ...
baseline_batch: int = 32                           # ... below its own value at this batch size
curve_rules: list = ["none", "linear", "linear_warmup", "sqrt_warmup"]  # rules shown in the training curves
''', "parameters"),
("code", '''
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.findings import goyal, hoffer
from bsresearch.sweep import variants
from bsresearch.plots import figure_grid, learning_curves, save_figure
from bsresearch.findings.goyal import rule_vs_batch
from bsresearch.sweep.spec import load_spec

out = Path(out_dir)
out.mkdir(parents=True, exist_ok=True)
spec = load_spec(spec_path)
order = variants.variant_order(spec)
runs = results.load(sweep, runs_root=runs_dir)
rows = results.generalization_gap(variants.runs_per_variant(runs, spec))
unique = rows.drop_duplicates("run_id")            # for captions: each run counted once
print(f"{runs['run_id'].nunique()} runs ({len(rows)} rule x batch x seed rows; the batch-{baseline_batch} runs "
      f"are shared by the rules):", dict(runs["state"].value_counts()), "| budget:", results.budget_description(rows))
rows.pivot_table(index="variant", columns="batch_size", values="state", aggfunc=lambda s: (s == "diverged").sum()
                 ).loc[order].rename_axis("diverged seeds")
'''),
("code", '''
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
(out / "summary.md").write_text(results.provenance_caption(unique) + "\\n\\n" + text)
print(text)
'''),
("code", '''
# where each rule breaks
verdict = goyal.breaking_batch(table, "test_acc", drop=break_drop, baseline_batch=baseline_batch)
verdict.to_csv(out / "breaking.csv", index=False)
verdict
'''),
("code", '''
# each rule minus linear + warmup at the same batch size (test accuracy, Welch 95% interval over seeds)
reference_rule = "linear_warmup" if "linear_warmup" in order else order[0]
versus_rule = stats.versus_within(rows, "test_acc", within="batch_size", compare="variant", reference=reference_rule)
versus_rule.to_csv(out / "versus_linear_warmup.csv", index=False)
cells = versus_rule.assign(text=lambda d: d.apply(
    lambda r: f"{100 * r['diff']:+.1f} [{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]", axis=1))
cells.pivot(index="variant", columns="batch_size", values="text").reindex(order).rename_axis(
    f"test acc minus {reference_rule} (pp)")
'''),
("code", '''
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
'''),
("code", '''
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
'''),
("code", '''
# the numbers the report cites: each rule at the largest batch where linear + warmup holds, and at 4000
lw = verdict.set_index("variant").loc["linear_warmup"] if "linear_warmup" in set(verdict["variant"]) else None
if lw is not None:
    print(f"linear + warmup: largest batch that holds {lw.largest_ok}, first broken {lw.first_broken} ({lw.why})")
t = table.set_index(["variant", "batch_size"])
for b in sorted(set(table["batch_size"])):
    cells = []
    for v in order:
        r = t.loc[(v, b)]
        cells.append(f"{v} {r.test_acc_mean:.4f}+-{r.test_acc_std:.4f}" + (f" ({int(r.n_diverged)} div)" if r.n_diverged else ""))
    print(f"B={b:5d}: " + " | ".join(cells))
'''),
]

HERE = Path(__file__).resolve().parent
write(cells(HOFFER), HERE / "21_hoffer.ipynb")
write(cells(GOYAL), HERE / "22_goyal.ipynb")
