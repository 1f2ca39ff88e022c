# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # One training run
#
# Every knob of the run is in the **parameters** cell below: all the fields of `RunConfig`
# (`bsresearch/config.py`), with their defaults and what each means. Edit them and run the notebook, or
# let a sweep execute it with papermill (`bsresearch sweep experiments/<spec>.yaml`): papermill injects
# each run's values after that cell and sets `run_dir`. Either way the same config gives the same run id
# and the same result.
#
# Batch size is the number of examples per optimizer update; the loss is the mean cross-entropy over the
# batch; `lr` is the rate at `base_batch_size`, scaled by `lr_scaling`. The run directory gets
# `config.json`, `status.json`, `history.csv`, `metrics.json` (see README).

# %% tags=["parameters"]
# Every RunConfig field with its type and default; papermill injects a sweep run's values after this cell.
from typing import Optional

# --- data
dataset: str = "mnist1d"                # one of DATASETS
data_dir: Optional[str] = None          # where dataset files/caches live; None: $BSRESEARCH_DATA_DIR or data/
train_size: Optional[int] = None        # use a fixed random subset of the training set (None: all of it)
# --- model
model: str = "cnn1d"                    # one of MODELS; cnn1d is the MNIST-1D paper's convnet
width: Optional[int] = None             # hidden units (mlp) or base channels (conv nets); None: model default
depth: Optional[int] = None             # hidden layers (mlp), conv layers (cnn1d), blocks per stage (resnet)
batchnorm: bool = False                 # BatchNorm after each hidden layer / conv
ghost_batch_size: Optional[int] = None  # BatchNorm statistics over virtual batches of this size (Hoffer et al.)
# --- optimisation
optimizer: str = "sgd"                  # sgd | adam | adamw
lr: float = 0.05                        # learning rate at base_batch_size (before lr_scaling)
momentum: float = 0.9                   # SGD momentum (adam: beta1 stays 0.9)
nesterov: bool = False                  # Nesterov momentum (sgd with momentum only)
weight_decay: float = 0.0               # L2 penalty coefficient (decoupled from the gradient for adamw)
batch_size: int = 32                    # examples per optimizer update: the quantity being studied
base_batch_size: int = 32               # the batch size at which `lr` was chosen
lr_scaling: str = "none"                # the lr used is lr * rule(batch_size / base_batch_size); none | linear | sqrt
schedule: str = "constant"              # constant | cosine | step, applied after warmup
warmup_epochs: float = 0.0              # linear warmup to the scaled lr (Goyal et al. use 5 epochs)
lr_decay_factor: float = 0.1            # step schedule: multiply the lr by this at each milestone
lr_decay_at: list[float] = [0.5, 0.75]  # step schedule: milestones as fractions of total steps
batch_schedule: str = "constant"        # constant or step: the batch grows at the lr_decay_at milestones instead
batch_growth: float = 1.0               # batch_schedule step: batch_size multiplies by this at each milestone
# --- duration
budget: str = "epochs"                  # epochs | steps | examples | target (full-train loss down to target_loss)
budget_amount: float = 20.0             # number of epochs/steps/examples (unused for budget target)
target_loss: float = 0.01               # budget target: stop when the full-train loss reaches this
max_steps: int = 20_000                 # budget target: give up after this many steps
# --- mechanics
micro_batch_size: Optional[int] = None  # gradient accumulation: memory only, the batch size is unchanged
precision: str = "fp32"                 # fp32 | bf16 (autocast, CPU and CUDA) | fp16 (CUDA, GradScaler)
sampling: str = "shuffle"               # shuffle (epochs without replacement) | replacement (iid batches)
# --- evaluation
eval_schedule: str = "log"              # every (eval_every steps) | log (eval_per_decade points per decade)
eval_every: int = 100                   # steps between evaluations, for eval_schedule every
eval_per_decade: int = 10               # evaluations per factor of 10 in steps, for eval_schedule log
eval_train_size: Optional[int] = None   # examples used for the train loss/accuracy (None: the whole set)
divergence_ratio: float = 10.0          # "diverged" when a batch loss exceeds this times the first one
measure: list[str] = []                 # measurements taken after training, from MEASUREMENTS
noise_scale_every: int = 0              # steps between two-batch noise-scale samples from micro-batches (0: off)
noise_scale_ema: float = 0.9            # EMA decay of those samples' |G|^2 and tr(Sigma) (history: noise_*_ema)
# --- reproducibility and execution
seed: int = 0                           # init, data order and probes get separate generators from this
device: str = "auto"                    # auto | cpu | cuda | cuda:N
threads: int = 1                        # torch CPU threads; 1 is fastest for small models (0: torch default)
checkpoint_every: int = 0               # steps between resumable checkpoints (0: none during the run)
save_checkpoint: bool = True            # keep the final weights in checkpoint.pt (for later measurements)

# --- where the run is written
runs_dir: str = "runs"                  # run directories go to RUNS_DIR/SWEEP/<run_id>/ (relative: to the project)
sweep: str = "notebook"                 # the folder for runs started from this notebook
run_dir: Optional[str] = None           # the exact run directory (a sweep sets it); None: RUNS_DIR/SWEEP/<run_id>

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch.config import RunConfig, run_id
from bsresearch.paths import project_path
from bsresearch.plots import run_curves
from bsresearch.train import run

# the whole config, field by field: a bad value stops here with a message naming the field
cfg = RunConfig(
    dataset=dataset, data_dir=data_dir, train_size=train_size, model=model, width=width, depth=depth,
    batchnorm=batchnorm, ghost_batch_size=ghost_batch_size, optimizer=optimizer, lr=lr, momentum=momentum,
    nesterov=nesterov, weight_decay=weight_decay, batch_size=batch_size, base_batch_size=base_batch_size,
    lr_scaling=lr_scaling, schedule=schedule, warmup_epochs=warmup_epochs, lr_decay_factor=lr_decay_factor,
    lr_decay_at=lr_decay_at, batch_schedule=batch_schedule, batch_growth=batch_growth, budget=budget,
    budget_amount=budget_amount, target_loss=target_loss,
    max_steps=max_steps, micro_batch_size=micro_batch_size, precision=precision, sampling=sampling,
    eval_schedule=eval_schedule, eval_every=eval_every, eval_per_decade=eval_per_decade,
    eval_train_size=eval_train_size, divergence_ratio=divergence_ratio, measure=measure,
    noise_scale_every=noise_scale_every, noise_scale_ema=noise_scale_ema, seed=seed, device=device,
    threads=threads, checkpoint_every=checkpoint_every, save_checkpoint=save_checkpoint,
)
run_dir = project_path(run_dir) if run_dir else project_path(runs_dir) / sweep / run_id(cfg)
print(f"run {run_id(cfg)} -> {run_dir}")

# %%
# trains (a progress bar in JupyterLab), or returns the finished result already in run_dir;
# failures are recorded, not raised
result = run(cfg, run_dir)
print(result.summary())

# %%
history = pd.read_csv(run_dir / "history.csv")
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5), layout="constrained")
run_curves(ax_loss, ax_acc, history)
fig.suptitle(f"{cfg.dataset} / {cfg.model}: batch {cfg.batch_size}, {cfg.optimizer} lr {cfg.lr:g}, "
             f"seed {cfg.seed} ({result.state})")
plt.show()
