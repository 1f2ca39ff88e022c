"""Regenerates the analysis notebooks of three reproductions (no outputs):
20_keskar.ipynb (Keskar et al.), 25_nqm.ipynb (Zhang et al.'s noisy quadratic model), 26_dinh.ipynb (Dinh et al.).

    .venv/bin/python notebooks/build_findings.py
Each is executed by `bsresearch report experiments/<name>.yaml` into reports/<name>/.
"""
import textwrap
from pathlib import Path

from nbbuild import code, md, write

HERE = Path(__file__).resolve().parent

REPORT_PARAMETERS = '''
sweep: str = "{sweep}"              # the sweep to analyse (bsresearch report passes it)
runs_dir: str = "runs"              # root folder of run directories
out_dir: str = "."                  # where figures and tables go (the report runs with this as cwd)
spec_path: Optional[str] = None     # the spec file (informational)
'''

# ----------------------------------------------------------------------------- Keskar
keskar = [
    md("""
    # Keskar et al. (2017): large-batch training, generalization gap and sharp minima — MNIST-1D

    Protocol (SCIENCE.md): the same initial weights for every batch size, Adam lr 1e-3 for all, no lr
    scaling, each run trained until the full-training-set cross-entropy is <= 0.01; then test accuracy,
    Keskar's sharpness phi (eps 1e-3 and 5e-4; full space, and a random 100-dimensional subspace) and the
    top Hessian eigenvalue. Small batch 32, large batch 400 (10% of the data) and 4000 (full batch).
    The paper: large-batch minima are 9-167x sharper (phi, full space, eps 1e-3) and test accuracy drops
    by 0.2-5 points. Then Keskar's parametric plot between the small- and large-batch solutions, and for
    contrast the same comparison at a fixed number of epochs (which mostly measures under-training).
    """),
    code("from typing import Optional\n" + textwrap.dedent(REPORT_PARAMETERS.format(sweep="keskar")).strip() + '''
contrast_sweep: Optional[str] = None    # the fixed-epochs comparison (None: SWEEP_epochs, if it exists)
small_batch: Optional[int] = None       # None: the smallest batch size of the sweep
eps_values: list = [1e-3, 5e-4]         # Keskar's two box sizes
subspace_dim: int = 100                 # Keskar's random subspace dimension p
''', tags=["parameters"]),
    code("""
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd
    from bsresearch import results, stats
    from bsresearch.findings.keskar import interpolate_runs
    from bsresearch.findings.runs import measure_runs
    from bsresearch.measure.sharpness import keskar_sharpness
    from bsresearch.plots import save_figure
    from bsresearch.findings.keskar import interpolation_plot
    from bsresearch.plots.sweeps import figure_grid, metric_vs_batch
    from bsresearch.runtime import make_generator

    runs = results.load(sweep, runs_dir)
    ok = results.finished(runs)
    small_batch = small_batch or int(ok["batch_size"].min())
    first = ok.iloc[0]
    setting = f"{first['dataset']}, {first['model']}, {first['optimizer']} lr {first['lr']:g}, no lr scaling"
    print(setting, "| small batch", small_batch)
    print(runs.groupby(["batch_size", "state"]).size().to_string())
    print("reached the 0.01 target:", int(ok["reached_target"].sum()), "of", len(ok))
    """),
    md("Keskar's sharpness in a random 100-dimensional subspace (A: n x p Gaussian, drawn per seed), from the saved weights."),
    code("""
    def eps_key(eps):  # the registry's spelling: 1e-3, 5e-4
        return f"{eps:.0e}".replace("e-0", "e-")

    def subspace_phi(model, data, cfg):
        out = {}
        for eps in eps_values:
            gen = make_generator(cfg.seed, "keskar-subspace")
            out[f"keskar_subspace_phi_eps{eps_key(eps)}"] = keskar_sharpness(
                model, data.x_train, data.y_train, eps, subspace_dim=subspace_dim, generator=gen).phi
        return out

    ok = ok.merge(measure_runs(ok, subspace_phi), on="run_id")
    metrics = ["test_acc", "train_acc", "train_loss", "gap_acc", "steps",
               *[f"keskar_phi_eps{eps_key(e)}" for e in eps_values],
               *[f"keskar_subspace_phi_eps{eps_key(e)}" for e in eps_values],
               "hessian_top_eigenvalue"]
    summary = stats.summarize(ok, "batch_size", metrics)
    summary.to_csv("keskar_summary.csv", index=False)
    ok[["batch_size", "seed", *metrics]].sort_values(["batch_size", "seed"]).to_csv("keskar_runs.csv", index=False)
    summary[["batch_size", "n"] + [f"{m}_mean" for m in metrics]]
    """),
    md("Large batch vs small batch from the same initial weights (paired by seed): sharpness ratios and accuracy differences."),
    code("""
    by_seed = ok.set_index(["seed", "batch_size"])
    paired = []
    for seed in sorted(ok["seed"].unique()):
        for b in sorted(ok["batch_size"].unique()):
            if b == small_batch or (seed, small_batch) not in by_seed.index or (seed, b) not in by_seed.index:
                continue
            sb, lb = by_seed.loc[(seed, small_batch)], by_seed.loc[(seed, b)]
            paired.append({"seed": seed, "large_batch": b, "test_acc_drop": sb["test_acc"] - lb["test_acc"],
                           **{f"ratio_{m}": lb[m] / sb[m] for m in metrics if "phi" in m or "eigenvalue" in m}})
    paired = pd.DataFrame(paired)
    paired_summary = stats.summarize(paired, "large_batch", [c for c in paired if c not in ("seed", "large_batch")])
    paired_summary.to_csv("keskar_paired.csv", index=False)
    paired_summary
    """),
    code("""
    fig, axes = figure_grid(4, width=3.6)
    for ax, (y, title) in zip(axes, [("test_acc", "test accuracy"), ("keskar_phi_eps1e-3", "phi, eps 1e-3 (%)"),
                                     ("keskar_subspace_phi_eps1e-3", "phi, eps 1e-3, 100-dim subspace (%)"),
                                     ("hessian_top_eigenvalue", "top Hessian eigenvalue")]):
        metric_vs_batch(ax, ok, y)
        ax.set_title(title, fontsize=10)
        if y != "test_acc":
            ax.set_yscale("log")
    save_figure(fig, "keskar_target", f"Keskar et al. ({setting}): test "
                "accuracy, Keskar sharpness phi (full space and a random 100-dim subspace, eps 1e-3) and the top "
                "Hessian eigenvalue at the end of training, against batch size; mean and 95% interval over seeds, "
                "dots are single seeds.", runs=ok)
    """),
    md("Keskar's parametric plot: loss and accuracy along (1 - alpha) x_SB + alpha x_LB, alpha in [-1, 2], for every seed."),
    code("""
    curves = []
    for seed in sorted(ok["seed"].unique()):
        sb = ok[(ok.seed == seed) & (ok.batch_size == small_batch)]
        for b in sorted(ok["batch_size"].unique()):
            lb = ok[(ok.seed == seed) & (ok.batch_size == b)]
            if b == small_batch or sb.empty or lb.empty:
                continue
            table = interpolate_runs(sb["run_dir"].iloc[0], lb["run_dir"].iloc[0])
            curves.append(table.assign(seed=seed, large_batch=b))
    curves = pd.concat(curves, ignore_index=True)
    curves.to_csv("keskar_interpolation.csv", index=False)
    large = sorted(curves["large_batch"].unique())
    fig, axes = plt.subplots(2, len(large), figsize=(4.2 * len(large), 6), layout="constrained", squeeze=False)
    for col, b in enumerate(large):
        interpolation_plot(axes[0][col], axes[1][col], curves[curves.large_batch == b],
                           a_label=f"B={small_batch}", b_label=f"B={b}")
        axes[0][col].set_title(f"B={small_batch} (alpha 0) to B={b} (alpha 1)", fontsize=10)
    save_figure(fig, "keskar_parametric", f"Keskar et al.'s parametric plot ({setting}): cross-entropy (log "
                "scale) and accuracy on the training and test sets along (1 - alpha) x_SB + alpha x_LB, 25 points "
                "in [-1, 2]; the line is the mean over seeds (each pair from the same initial weights), the band "
                "the range.", runs=ok)
    """),
    md("Contrast: the same batch sizes trained for a fixed number of epochs (about what the small batch needs to reach the target)."),
    code("""
    from pathlib import Path
    contrast_sweep = contrast_sweep or f"{sweep}_epochs"
    if not (Path(runs_dir) / contrast_sweep).is_dir():
        print(f"no contrast sweep {contrast_sweep!r} in {runs_dir}: skipped")
    else:
        fixed = results.finished(results.load(contrast_sweep, runs_dir))
        epochs = f"fixed {fixed['budget_amount'].iloc[0]:g} epochs"
        both = pd.concat([ok.assign(protocol=f"to train loss {first['target_loss']:g}"), fixed.assign(protocol=epochs)],
                         ignore_index=True)
        contrast_metrics = ["test_acc", "train_loss", "train_acc", "steps", "keskar_phi_eps1e-3",
                            "hessian_top_eigenvalue"]
        contrast = stats.summarize(both, ["protocol", "batch_size"], contrast_metrics)
        contrast.to_csv("keskar_fixed_epochs_summary.csv", index=False)
        fig, axes = figure_grid(3, width=3.8)
        for ax, y in zip(axes, ["test_acc", "train_loss", "keskar_phi_eps1e-3"]):
            metric_vs_batch(ax, both, y, hue="protocol")
            if y != "test_acc":
                ax.set_yscale("log")
        save_figure(fig, "keskar_fixed_epochs", f"Keskar comparison ({setting}) under two budgets: trained to the "
                    f"target train loss (the protocol) vs {epochs} for every batch size. At fixed epochs the large "
                    "batches take few steps and are under-trained (high train loss), so their lower test accuracy "
                    "is not evidence for sharp minima. Mean and 95% interval over seeds.", runs=both)
        display(contrast[["protocol", "batch_size", "n"] + [f"{m}_mean" for m in contrast_metrics]])
    """),
]

# ----------------------------------------------------------------------------- NQM
nqm = [
    md("""
    # Zhang et al. (2019): the noisy quadratic model — which algorithmic choices matter at which batch sizes

    L(theta) = 1/2 sum_i h_i theta_i^2 with h_i = 1/i (d = 10^4), mini-batch gradient noise covariance H/B,
    E theta_0^2 = 1. Steps to reach 1% of the initial loss, computed exactly from the second-moment
    recurrence (bsresearch.nqm), with the learning rate (and momentum) tuned for every batch size. The paper:
    momentum and preconditioning extend perfect scaling to larger batch sizes (raise the critical batch size)
    and do not help at small batch sizes.
    """),
    code("from typing import Optional\n" + textwrap.dedent(REPORT_PARAMETERS.format(sweep="nqm")).strip() + '''
dim: int = 10_000                 # number of curvature directions (Zhang et al.: 10^4)
target_fraction: float = 0.01     # target: this fraction of the initial loss
max_batch_exponent: int = 17      # batch sizes 2^0 .. 2^max
lr_grid: list = [-4.0, 1.0, 41]   # np.logspace(*lr_grid): lrs 1e-4 .. 10, 10 per decade
''', tags=["parameters"]),
    code("""
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd
    from bsresearch.measure.critical import fit_critical_batch
    from bsresearch.findings.nqm import NQM, OPTIMIZERS, steps_vs_batch_size
    from bsresearch.plots import save_figure
    from bsresearch.findings.nqm import steps_by_optimizer
    from bsresearch.runtime import git_commit

    model = NQM.zhang(dim)
    target = target_fraction * model.initial_loss()
    batch_sizes = [2 ** k for k in range(max_batch_exponent + 1)]
    lrs = np.logspace(lr_grid[0], lr_grid[1], int(lr_grid[2]))
    table = pd.DataFrame(steps_vs_batch_size(model, batch_sizes, target, lrs=lrs))
    table.to_csv("nqm_steps.csv", index=False)
    print(f"initial loss {model.initial_loss():.4f}, target {target:.4f}; best lr on the grid edge for",
          int(table["lr_at_grid_edge"].sum()), "of", len(table), "points")
    table.pivot(index="batch_size", columns="optimizer", values="steps")
    """),
    code("""
    fits = {name: fit_critical_batch(g["batch_size"], g["steps"]) for name, g in table.groupby("optimizer", sort=False)}
    fit_table = pd.DataFrame([{"optimizer": n, "b_crit": f.b_crit, "b_crit_low": f.b_crit_interval[0],
                               "b_crit_high": f.b_crit_interval[1], "s_min": f.s_min,
                               "rms_log_residual": f.rms_log_residual,
                               "steps_at_batch_1": float(table[(table.optimizer == n) & (table.batch_size == 1)]["steps"].iloc[0]),
                               "fewest_steps": float(table[table.optimizer == n]["steps"].min())}
                              for n, f in fits.items()])
    fit_table.to_csv("nqm_critical_batch.csv", index=False)
    fit_table
    """),
    code("""
    fig, ax = plt.subplots(figsize=(6.4, 4.6), layout="constrained")
    steps_by_optimizer(ax, table, fits)
    ax.set_title(f"NQM, d = {dim}, target {target_fraction:.0%} of the initial loss", fontsize=10)
    save_figure(fig, "nqm_steps", f"Noisy quadratic model (Zhang et al. 2019): steps to reach {target_fraction:.0%} of "
                "the initial loss against batch size, lr (and momentum in {0, 0.5, 0.9, 0.99}) tuned per batch size "
                "on a log grid; exact expected loss, no sampling. Dotted: perfect scaling from batch 1; dashed: "
                f"B_crit of the fit S = S_min (1 + B_crit/B). Commit {git_commit()}.")
    """),
]

# ----------------------------------------------------------------------------- Dinh
dinh = [
    md("""
    # Dinh et al. (2017): sharp minima can generalize — a reparameterisation changes sharpness, not the function

    For ReLU networks, multiplying one layer by alpha > 0 and the next by 1/alpha leaves the function (and so
    train and test loss and accuracy) unchanged, yet changes curvature-based sharpness arbitrarily. We apply
    this to the first two conv layers of trained MNIST-1D CNNs (the Keskar sweep's small- and large-batch
    solutions) and measure, for each alpha: the largest change of the outputs, Keskar's phi, the top Hessian
    eigenvalue, the Hessian trace, worst-case sharpness (L2 ball), and adaptive worst-case and average-case
    sharpness (Kwon et al. 2021), which should not change.
    """),
    code("from typing import Optional\n" + textwrap.dedent(REPORT_PARAMETERS.format(sweep="dinh")).strip() + '''
source_sweep: str = "keskar"        # trained models to reparameterise (their checkpoints)
batch_sizes: list = [32, 4000]      # which of its runs
seeds: list = [0, 1, 2]
alphas: list = [0.1, 0.3, 1.0, 3.0, 10.0]
pair: int = 0                       # rescale weighted layers (pair, pair + 1): conv1 x alpha, conv2 / alpha
''', tags=["parameters"]),
    code("""
    import matplotlib.pyplot as plt
    import pandas as pd
    import torch
    from bsresearch import results, stats
    from bsresearch.findings.dinh import relu_rescale
    from bsresearch.data import dataset_for
    from bsresearch.measure import curvature, sharpness
    from bsresearch.plots import save_figure
    from bsresearch.findings.dinh import reparameterisation_plot
    from bsresearch.runtime import make_generator
    from bsresearch.train import evaluate, load_trained_model

    source = results.finished(results.load(source_sweep, runs_dir))
    chosen = source[source.batch_size.isin(batch_sizes) & source.seed.isin(seeds)]
    rows = []
    for _, run in chosen.iterrows():
        model, cfg = load_trained_model(run["run_dir"])
        data = dataset_for(cfg)
        x, y = data.x_train, data.y_train
        reference = model(x).detach()
        for alpha in alphas:
            other = relu_rescale(model, alpha, pair)
            gen = lambda: make_generator(cfg.seed, "dinh")
            rows.append({
                "batch_size": cfg.batch_size, "seed": cfg.seed, "alpha": alpha,
                "max_output_change": float((other(x).detach() - reference).abs().max()),
                "train_loss": evaluate(other, x, y)[0], "test_acc": evaluate(other, data.x_test, data.y_test)[1],
                "keskar_phi": sharpness.keskar_sharpness(other, x, y, 1e-3).phi,
                "top_eigenvalue": curvature.top_eigenvalues(other, [(x, y)], k=1, tol=1e-3).eigenvalues[0],
                "hessian_trace": curvature.hessian_trace(other, [(x, y)], n_probes=10, generator=gen()).trace,
                "worst_case": sharpness.worst_case_sharpness(other, x, y, 0.05).sharpness,
                "adaptive_worst_case": sharpness.worst_case_sharpness(other, x, y, 0.5, adaptive=True).sharpness,
                "adaptive_average_case": sharpness.average_case_sharpness(other, x, y, 0.05, adaptive=True,
                                                                         generator=gen()).sharpness,
            })
    table = pd.DataFrame(rows)
    table.to_csv("dinh_runs.csv", index=False)
    measures = ["train_loss", "test_acc", "keskar_phi", "top_eigenvalue", "hessian_trace", "worst_case",
                "adaptive_worst_case", "adaptive_average_case"]
    summary = stats.summarize(table, ["batch_size", "alpha"], ["max_output_change", *measures])
    summary.to_csv("dinh_summary.csv", index=False)
    summary[["batch_size", "alpha", "n", "max_output_change_mean"] + [f"{m}_mean" for m in measures]]
    """),
    code("""
    shown = {"top_eigenvalue": "top Hessian eigenvalue", "hessian_trace": "Hessian trace", "keskar_phi": "Keskar phi",
             "worst_case": "worst-case sharpness", "adaptive_worst_case": "adaptive worst-case",
             "adaptive_average_case": "adaptive average-case", "train_loss": "train loss (the function)"}
    fig, axes = plt.subplots(1, len(batch_sizes), figsize=(5.2 * len(batch_sizes), 4.2), layout="constrained",
                             squeeze=False)
    for ax, b in zip(axes[0], batch_sizes):
        mean = table[table.batch_size == b].groupby("alpha", as_index=False)[list(shown)].mean()
        reparameterisation_plot(ax, mean, shown)
        ax.set_title(f"cnn1d trained at batch {b} (mean over seeds {seeds})", fontsize=10)
    save_figure(fig, "dinh_reparameterisation", "Dinh et al. on MNIST-1D: the first conv layer multiplied by alpha and "
                "the second divided by alpha (the same function: outputs unchanged to float precision). Each measure "
                "relative to its value at alpha = 1, mean over seeds.", runs=chosen)
    """),
]

write(keskar, HERE / "20_keskar.ipynb")
write(nqm, HERE / "25_nqm.ipynb")
write(dinh, HERE / "26_dinh.ipynb")
print("ok")
