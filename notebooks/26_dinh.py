# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # Dinh et al. (2017): sharp minima can generalize — a reparameterisation changes sharpness, not the function
#
# For ReLU networks, multiplying one layer by alpha > 0 and the next by 1/alpha leaves the function (and so
# train and test loss and accuracy) unchanged, yet changes curvature-based sharpness arbitrarily. We apply
# this to the first two conv layers of trained MNIST-1D CNNs (the Keskar sweep's small- and large-batch
# solutions) and measure, for each alpha: the largest change of the outputs, Keskar's phi, the top Hessian
# eigenvalue, the Hessian trace, worst-case sharpness (L2 ball), and adaptive worst-case and average-case
# sharpness (Kwon et al. 2021), which should not change.

# %% tags=["parameters"]
from typing import Optional

sweep: str = "dinh"              # the sweep to analyse (bsresearch report passes it)
runs_dir: str = "runs"              # root folder of run directories (relative: to the project)
out_dir: str = "reports/dinh"       # figures and tables are written here (relative: to the project)
spec_path: Optional[str] = None     # the spec file (informational)
source_sweep: str = "keskar"        # trained models to reparameterise (their checkpoints)
batch_sizes: list = [32, 4000]      # which of its runs
seeds: list = [0, 1, 2]
alphas: list = [0.1, 0.3, 1.0, 3.0, 10.0]
pair: int = 0                       # rescale weighted layers (pair, pair + 1): conv1 x alpha, conv2 / alpha

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch import results, stats
from bsresearch.data import dataset_for
from bsresearch.findings.dinh import relu_rescale, reparameterisation_plot
from bsresearch.measure import curvature, sharpness
from bsresearch.paths import project_path, require_sweep
from bsresearch.plots import save_figure
from bsresearch.runtime import make_generator
from bsresearch.train import evaluate, load_trained_model

runs_dir, out = project_path(runs_dir), project_path(out_dir)   # relative paths: to the project
out.mkdir(parents=True, exist_ok=True)
source = results.finished(results.load(require_sweep(source_sweep, runs_dir)))
chosen = source[source.batch_size.isin(batch_sizes) & source.seed.isin(seeds)]
rows = []
for _, run in chosen.iterrows():
    model, cfg = load_trained_model(run["run_dir"])
    data = dataset_for(cfg)
    x, y = data.x_train, data.y_train
    reference = model(x).detach()
    for alpha in alphas:
        other = relu_rescale(model, alpha, pair)
        rows.append({
            "batch_size": cfg.batch_size, "seed": cfg.seed, "alpha": alpha,
            "max_output_change": float((other(x).detach() - reference).abs().max()),
            "train_loss": evaluate(other, x, y)[0], "test_acc": evaluate(other, data.x_test, data.y_test)[1],
            "keskar_phi": sharpness.keskar_sharpness(other, x, y, 1e-3).phi,
            "top_eigenvalue": curvature.top_eigenvalues(other, [(x, y)], k=1, tol=1e-3).eigenvalues[0],
            "hessian_trace": curvature.hessian_trace(other, [(x, y)], n_probes=10,
                                                     generator=make_generator(cfg.seed, "dinh")).trace,
            "worst_case": sharpness.worst_case_sharpness(other, x, y, 0.05).sharpness,
            "adaptive_worst_case": sharpness.worst_case_sharpness(other, x, y, 0.5, adaptive=True).sharpness,
            "adaptive_average_case": sharpness.average_case_sharpness(
                other, x, y, 0.05, adaptive=True, generator=make_generator(cfg.seed, "dinh")).sharpness,
        })
table = pd.DataFrame(rows)
table.to_csv(out / "dinh_runs.csv", index=False)
measures = ["train_loss", "test_acc", "keskar_phi", "top_eigenvalue", "hessian_trace", "worst_case",
            "adaptive_worst_case", "adaptive_average_case"]
summary = stats.summarize(table, ["batch_size", "alpha"], ["max_output_change", *measures])
summary.to_csv(out / "dinh_summary.csv", index=False)
summary[["batch_size", "alpha", "n", "max_output_change_mean"] + [f"{m}_mean" for m in measures]]

# %%
shown = {"top_eigenvalue": "top Hessian eigenvalue", "hessian_trace": "Hessian trace", "keskar_phi": "Keskar phi",
         "worst_case": "worst-case sharpness", "adaptive_worst_case": "adaptive worst-case",
         "adaptive_average_case": "adaptive average-case", "train_loss": "train loss (the function)"}
fig, axes = plt.subplots(1, len(batch_sizes), figsize=(5.2 * len(batch_sizes), 4.2), layout="constrained",
                         squeeze=False)
for ax, b in zip(axes[0], batch_sizes):
    mean = table[table.batch_size == b].groupby("alpha", as_index=False)[list(shown)].mean()
    reparameterisation_plot(ax, mean, shown)
    ax.set_title(f"cnn1d trained at batch {b} (mean over seeds {seeds})", fontsize=10)
save_figure(fig, out / "dinh_reparameterisation", "Dinh et al. on MNIST-1D: the first conv layer multiplied by "
            "alpha and "
            "the second divided by alpha (the same function: outputs unchanged to float precision). Each measure "
            "relative to its value at alpha = 1, mean over seeds.", runs=chosen)
