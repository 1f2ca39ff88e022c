# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 03 · Sharpness, curvature and the 1-D interpolation between a small- and a large-batch solution
#
# Keskar et al. (2017): train the same initialisation with a small batch (SB) and a large batch (LB), same
# optimizer (Adam, lr 1e-3, no lr scaling), until the full training loss reaches a target; then compare
# test accuracy, epsilon-sharpness phi (full space, eps 1e-3 and 5e-4, 10 L-BFGS-B iterations), the top
# Hessian eigenvalues and trace, worst/average-case and adaptive sharpness, and the loss along the line
# theta(alpha) = (1 - alpha) theta_SB + alpha theta_LB (their parametric plot, 25 points in [-1, 2]).
# All measurements use the full training set and eval-mode BatchNorm. Dinh et al.'s caveat applies: plain
# sharpness is not invariant to reparametrisation; the adaptive numbers are.

# %% tags=["parameters"]
# Parameters (papermill injects overrides after this cell).
dataset: str = "mnist1d"           # a bsresearch dataset, or FILE.py:NAME
model: str = "cnn1d"               # mlp | cnn1d | ..., or your own as FILE.py:NAME
model_kwargs: dict = {}            # keyword arguments for your model factory
loss: str = "cross_entropy"        # the runs' loss: cross_entropy, mse, ... or FILE.py:NAME
optimizer: str = "adam"            # Keskar et al. used Adam
lr: float = 1e-3                   # the same for both batch sizes (no lr scaling)
small_batch: int = 64              # SB
large_batch: int = 400             # LB (Keskar et al.: 10% of the training set)
budget: str = "target"             # target (until the train loss reaches target_loss), steps or epochs
budget_amount: float = 20.0        # steps or epochs when budget is not target
target_loss: float = 0.01          # Keskar protocol: train until the full training loss reaches this
max_steps: int = 20_000            # cap for budget target
train_size: int = 0                # 0: the whole training set (synthetic: number of examples)
eps: list = [1e-3, 5e-4]           # Keskar box sizes
top_k: int = 3                     # Hessian eigenvalues (Lanczos)
trace_probes: int = 20             # Hutchinson probes
density_probes: int = 4            # stochastic Lanczos quadrature probes (0: skip the spectral density)
density_iter: int = 60             # Lanczos steps per probe
n_alphas: int = 25                 # interpolation points in [-1, 2]
seed: int = 0                      # same init for SB and LB
device: str = "auto"               # auto | cpu | cuda | cuda:N
out_dir: str = "reports/sharpness" # figures go here (relative: to the project)
tag: str = "nb03"

# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bsresearch.config import RunConfig
from bsresearch.data import resident_dataset_for
from bsresearch.losses import loss_for
from bsresearch.measure import curvature, landscape, sharpness
from bsresearch.measure.functional import batches_of
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.references import short_name
from bsresearch.runtime import make_generator, resolve_device
from bsresearch.train import run

out = project_path(out_dir)
base = RunConfig(dataset=dataset, model=model, model_kwargs=model_kwargs, loss=loss, optimizer=optimizer, lr=lr,
                 lr_scaling="none", budget=budget,
                 budget_amount=budget_amount, target_loss=target_loss, max_steps=max_steps,
                 train_size=train_size or None, seed=seed, device=device, save_checkpoint=False)
results = {name: run(base.replace(batch_size=b, base_batch_size=b), progress=False)
           for name, b in [("SB", small_batch), ("LB", large_batch)]}
dev = resolve_device(device)
data = resident_dataset_for(base, dev)
x, y, loss_fn = data.x_train, data.y_train, loss_for(loss)
for name, r in results.items():
    print(name, r.summary().splitlines()[-1])


# %%
def measurements(m):
    probe = make_generator(seed, "probe")
    batches = batches_of(x, y)
    row = {f"phi eps={e:g} (%)": sharpness.keskar_sharpness(m, x, y, e, generator=probe, loss_fn=loss_fn).phi
           for e in eps}
    top = curvature.top_eigenvalues(m, batches, k=top_k, tol=1e-3, generator=probe, loss_fn=loss_fn)
    row.update({f"lambda_{i + 1}": v for i, v in enumerate(top.eigenvalues)})
    trace = curvature.hessian_trace(m, batches, n_probes=trace_probes, generator=probe, loss_fn=loss_fn)
    row.update({"trace": trace.trace, "trace s.e.": trace.std_error,
                "worst rho=0.05": sharpness.worst_case_sharpness(m, x, y, 0.05, loss_fn=loss_fn).sharpness,
                "average sigma=0.01": sharpness.average_case_sharpness(m, x, y, 0.01, generator=probe,
                                                                       loss_fn=loss_fn).sharpness,
                "adaptive worst rho=0.5": sharpness.worst_case_sharpness(m, x, y, 0.5, adaptive=True,
                                                                         loss_fn=loss_fn).sharpness})
    return row


batch_of = {"SB": small_batch, "LB": large_batch}
table = pd.DataFrame({name: {"batch": batch_of[name],
                             "state": r.state, "steps": r.metrics.get("steps"),
                             "train loss": r.metrics.get("train_loss"), "test acc": r.metrics.get("test_acc"),
                             **measurements(r.model)} for name, r in results.items()})
table

# %%
alphas = np.linspace(-1, 2, n_alphas)
line = landscape.interpolate(results["SB"].model, results["LB"].model, data, alphas=alphas, loss_fn=loss_fn)
fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
for split, style in [("train", "-"), ("test", "--")]:
    part = line[line.split == split]
    ax.plot(part.alpha, part.loss, "b" + style, label=f"{split} loss")
ax.set(yscale="log", xlabel="alpha  (0: SB, 1: LB)", ylabel=f"loss ({loss})",
       title=f"{short_name(dataset)} / {short_name(model)}: SB {small_batch} -> LB {large_batch}")
ax.legend(loc="upper left")
if line.accuracy.notna().any():   # a regressor has no accuracy
    acc = ax.twinx()
    for split, style in [("train", "-"), ("test", "--")]:
        part = line[line.split == split]
        acc.plot(part.alpha, 100 * part.accuracy, "r" + style, label=f"{split} accuracy")
    acc.set_ylabel("accuracy (%)", color="r")
    acc.legend(loc="upper right")
save_figure(fig, out / f"{tag}_interpolation", f"Loss and accuracy on the line from the small-batch "
            f"({small_batch}) to the large-batch ({large_batch}) solution, {short_name(dataset)}/"
            f"{short_name(model)}, {optimizer} lr {lr:g}, seed {seed}; BatchNorm buffers interpolated too")
plt.show()

# %%
if density_probes:
    fig, ax = plt.subplots(figsize=(6.5, 3.5), layout="constrained")
    for name, r in results.items():
        density = curvature.spectral_density(r.model, batches_of(x, y), n_probes=density_probes,
                                             n_iter=density_iter, generator=make_generator(seed, "probe"),
                                             loss_fn=loss_fn)
        grid = np.linspace(density.nodes.min() - 1, density.nodes.max() + 1, 1000)
        ax.plot(grid, density.density(grid, sigma=0.02 * (grid[-1] - grid[0])) + 1e-8, label=name)
    ax.set(yscale="log", xlabel="Hessian eigenvalue", ylabel="density", title="spectral density (SLQ)")
    ax.legend()
    save_figure(fig, out / f"{tag}_spectrum", f"Hessian spectral density by stochastic Lanczos "
                f"quadrature ({density_probes} probes x {density_iter} steps), SB vs LB")
    plt.show()
