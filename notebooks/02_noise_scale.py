# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 02 · Gradient noise scale along training
#
# McCandlish et al. (2018): with per-example gradients g_i (of the run's mean loss), G their mean and Sigma
# their covariance, the simple noise scale **B_simple = tr(Sigma) / |G|^2** (in examples) predicts the critical
# batch size, beyond which a larger batch stops buying fewer steps. This notebook trains one run and measures
# B_simple at log-spaced steps three ways:
#
# - **exact**: per-example gradients of the whole training set (torch.func, in chunks), no sampling error;
# - **two-batch**: gradient norms at a small and a large batch, averaged over draws, ratio taken last (appendix A.1);
# - **EMA**: the training loop's own estimate from the micro-batches of each step (`noise_scale_every`), at no
#   extra cost: |G_small|^2 from one micro-batch, |G_big|^2 from the whole batch, same parameters.
#
# Per-example quantities use eval-mode BatchNorm. At the end: B_simple per layer and B_noise = tr(H Sigma)/(G^T H G).

# %% tags=["parameters"]
# Parameters (papermill injects overrides after this cell).
dataset: str = "mnist1d"          # a bsresearch dataset (mnist1d: 4000 training signals, offline), or FILE.py:NAME
model: str = "cnn1d"              # mlp | cnn1d | ..., or your own as FILE.py:NAME
model_kwargs: dict = {}           # keyword arguments for your model factory
loss: str = "cross_entropy"       # the run's loss: cross_entropy, mse, ... or FILE.py:NAME
optimizer: str = "sgd"            # sgd | adam | adamw
lr: float = 0.05                  # constant learning rate
batch_size: int = 128             # examples per update
micro_batch_size: int = 32        # the EMA's small batch (one micro-batch); must divide batch_size
steps: int = 3000                 # training steps
n_checkpoints: int = 12           # log-spaced steps at which the exact and two-batch estimates are taken
b_small: int = 32                 # two-batch estimator: small batch
b_big: int = 1024                 # two-batch estimator: large batch
n_draws: int = 20                 # two-batch estimator: draws averaged before the ratio
hessian_probes: int = 10          # Hutchinson probes for B_noise at the end
train_size: int = 0               # 0: the whole training set (synthetic: number of examples)
seed: int = 0                     # init, data order and probes
device: str = "auto"              # auto | cpu | cuda | cuda:N
out_dir: str = "reports/noise"    # figures go here (relative: to the project)
tag: str = "nb02"

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bsresearch.callbacks import AtSteps
from bsresearch.config import RunConfig
from bsresearch.data import in_chunks, resident_dataset_for
from bsresearch.engine import evaluate_batches
from bsresearch.losses import loss_for
from bsresearch.noise import MicroBatchNoise, gradient_noise_scale, hessian_noise_scale, two_batch_noise_scale
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.references import short_name
from bsresearch.runtime import make_generator, resolve_device, set_threads
from bsresearch.train import run

cfg = RunConfig(dataset=dataset, model=model, model_kwargs=model_kwargs, loss=loss, optimizer=optimizer, lr=lr,
                batch_size=batch_size, base_batch_size=batch_size, micro_batch_size=micro_batch_size,
                noise_scale_every=1, budget="steps", budget_amount=steps, eval_schedule="every", eval_every=steps,
                train_size=train_size or None, seed=seed, device=device, save_checkpoint=False)
out = project_path(out_dir)
dev = resolve_device(cfg.device)
set_threads(1)
data = resident_dataset_for(cfg, dev)
x, y, loss_fn = data.x_train, data.y_train, loss_for(cfg.loss)
checkpoints = sorted({0, steps} | set(np.geomspace(1, steps, n_checkpoints).round().astype(int).tolist()))
print(dev, data.n_train, "examples; measuring at steps", checkpoints)

# %%
rows = []


def measure(member, loop):
    """At a checkpoint of the run: exact and two-batch B_simple, and the training loop's own EMA."""
    state = member.state
    exact = gradient_noise_scale(state.model, x, y, unbiased=False, loss_fn=loss_fn)
    two = two_batch_noise_scale(state.model, x, y, b_small, min(b_big, len(x)), n_draws,
                                generator=state.generators.probe, loss_fn=loss_fn)
    # the EMA has no estimate before its first sample, nor while its |G|^2 estimate is not positive
    ema_now = loop.callback(MicroBatchNoise).of(member)
    ema = ema_now.b_simple if ema_now else math.nan
    train_loss = evaluate_batches(state.model, in_chunks(x, y, 2048), loss_fn, accuracy=False)[0]
    rows.append({"step": state.step, "train_loss": train_loss, "exact": exact.b_simple, "two_batch": two.b_simple,
                 "ema": ema if math.isfinite(ema) and ema > 0 else math.nan})


result = run(cfg, callbacks=[AtSteps(checkpoints, measure)])   # the one training loop, measured along the way
table = pd.DataFrame(rows)
table.style.format(precision=4, na_rep="")   # blank: no estimate yet

# %%
fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
for column, style in [("exact", "o-"), ("two_batch", "s--"), ("ema", "^:")]:
    ax.plot(table.step.clip(lower=1), table[column], style, label=column.replace("_", "-"))
ax.set(xscale="log", yscale="log", xlabel="step (step 0 drawn at 1)", ylabel="B_simple (examples)",
       title=f"{short_name(dataset)} / {short_name(model)}, batch {batch_size}, {optimizer} lr {lr:g}")
twin = ax.twinx()
twin.plot(table.step.clip(lower=1), table.train_loss, color="0.6", lw=1)
twin.set_ylabel("train loss (grey)")
ax.legend()
save_figure(fig, out / f"{tag}_b_simple", f"B_simple along training ({short_name(dataset)}/{short_name(model)}, "
            f"batch "
            f"{batch_size}, seed {seed}): exact per-example, two-batch ({b_small}/{b_big}, {n_draws} draws), "
            f"and the training loop's EMA over micro-batches of {micro_batch_size}")
plt.show()

# %% [markdown]
# ## At the end of training: per layer, and with the Hessian (B_noise)

# %%
model_at_end = result.model
final = gradient_noise_scale(model_at_end, x, y, unbiased=False, per_layer=True, loss_fn=loss_fn)
with_hessian = hessian_noise_scale(model_at_end, x, y, n_probes=hessian_probes, loss_fn=loss_fn,
                                   generator=make_generator(seed, "probe"))
modules = dict(model_at_end.named_modules())
layers = pd.DataFrame([{"layer": f"{name} {type(modules[name]).__name__}",
                        "weight": "x".join(map(str, modules[name].weight.shape)),
                        "b_simple": r.b_simple, "trace_cov": r.trace_cov, "grad_sq_norm": r.grad_sq_norm}
                       for name, r in final.per_layer.items()])
print(f"B_simple {final.b_simple:.4g}   B_noise {with_hessian.b_noise:.4g} +- {with_hessian.b_noise_std_error:.2g}")
layers
