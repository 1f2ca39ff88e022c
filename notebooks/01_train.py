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
# Batch size is the number of examples per optimizer update; the loss is a mean over the batch; `lr` is the
# rate at `base_batch_size`, scaled by `lr_scaling`. `model`, `dataset` and `loss` take a built-in name or
# your own code as `FILE.py:NAME` (e.g. `model = "examples/lm.py:make_model"`, with `model_kwargs` for its
# factory; relative paths are relative to the project). The run directory gets `config.json`,
# `status.json`, `history.csv`, `metrics.json` (see docs/runs.md).

# %% tags=["parameters"]
# Every RunConfig field with its type and default (bsresearch/config.py, where this cell is generated
# from); papermill injects a sweep run's values after this cell.
from typing import Optional

# --- data
dataset: str = "mnist1d"                # one of DATASETS, or FILE.py:NAME / module:NAME of your dataset factory
dataset_kwargs: dict = {}               # keyword arguments for your dataset factory
test_size: float = 0.2                  # a factory's single dataset: test examples held out (fraction < 1, or count)
data_dir: Optional[str] = None          # None: $BSRESEARCH_DATA_DIR, the checkout's data/ or ~/.cache/bsresearch
train_size: Optional[int] = None        # use a fixed random subset of the training set (None: all of it)
data_loading: str = "auto"              # auto | resident (tensors on the device) | stream (torch DataLoader)
loader_workers: int = 0                 # stream: DataLoader worker processes (0: in this process)
# --- model and loss
model: str = "cnn1d"                    # one of MODELS, or FILE.py:NAME / module:NAME of your model factory
model_kwargs: dict = {}                 # keyword arguments for your model factory (e.g. {width: 128})
width: Optional[int] = None             # built-in models: hidden units (mlp) or base channels (conv nets)
depth: Optional[int] = None             # built-in models: hidden layers (mlp), conv layers (cnn1d), blocks (resnet)
batchnorm: bool = False                 # built-in models: BatchNorm after each hidden layer / conv
ghost_batch_size: Optional[int] = None  # BatchNorm statistics over virtual batches of this size (Hoffer et al.)
loss: str = "cross_entropy"             # one of LOSSES (a batch mean), or FILE.py:NAME of loss(output, target)
# --- optimisation
optimizer: str = "sgd"                  # sgd | adam | adamw
lr: float = 0.05                        # learning rate at base_batch_size (before lr_scaling)
momentum: float = 0.9                   # SGD momentum (adam: beta1 stays 0.9)
adam_beta2: float = 0.999               # adam, adamw: decay of the second-moment average at base_batch_size
beta2_scaling: str = "none"             # none | half_life: adam_beta2 ** (batch / base_batch_size) (Marek et al.)
nesterov: bool = False                  # SGD: Nesterov momentum (needs momentum > 0)
weight_decay: float = 0.0               # L2 penalty (sgd, adam) or decoupled decay (adamw), per update
batch_size: int = 32                    # examples per optimizer update: the quantity being studied
base_batch_size: int = 32               # the batch size at which `lr` was chosen
lr_scaling: str = "none"                # the lr used is lr * rule(batch_size / base_batch_size); none | linear | sqrt
schedule: str = "constant"              # constant | cosine | step | wsd (warmup-stable-decay), applied after warmup
warmup_epochs: float = 0.0              # linear warmup to the scaled lr (Goyal et al. use 5 epochs)
lr_decay_factor: float = 0.1            # step schedule: multiply the lr by this at each milestone
lr_decay_at: list[float] = [0.5, 0.75]  # step schedule: milestones as fractions of total steps
lr_decay_fraction: float = 0.2          # wsd schedule: the last fraction of the steps after warmup, lr linear to 0
batch_schedule: str = "constant"        # constant | step: the batch grows at the lr_decay_at milestones instead
batch_growth: float = 1.0               # batch_schedule step: batch_size multiplies by this at each milestone
batch_at_tokens: list[float] = []       # batch_schedule tokens: tokens trained at which the batch changes
batch_sizes: list[int] = []             # batch_schedule tokens: the batch size from each of those on
# --- duration
budget: str = "epochs"                  # epochs | steps | examples | tokens | target (train loss down to target_loss)
budget_amount: float = 20.0             # number of epochs/steps/examples/tokens (unused for budget target)
target_loss: float = 0.01               # budget target: stop when the full-train loss reaches this
max_steps: int = 20000                  # budget target: give up after this many steps
# --- mechanics
micro_batch_size: Optional[int] = None  # gradient accumulation: memory only, the batch size is unchanged
devices: int = 1                        # processes (one device each) that train the run together, data-parallel
sync_batchnorm: bool = False            # devices > 1: BatchNorm over the global batch, not each device's share
precision: str = "fp32"                 # fp32 | bf16 (autocast, CPU and CUDA) | fp16 (CUDA, GradScaler)
sampling: str = "shuffle"               # shuffle (epochs without replacement) | replacement (iid batches)
# --- evaluation
eval_schedule: str = "log"              # every (eval_every steps) | log (eval_per_decade points per decade)
eval_every: int = 100                   # eval_schedule every: steps between evaluations
eval_per_decade: int = 10               # eval_schedule log: evaluations per factor of 10 in steps
eval_train_size: Optional[int] = None   # examples used for the train loss/accuracy (None: the whole set)
eval_test_size: Optional[int] = None    # the first examples of the test set evaluated (None: all of it)
eval_weight_average: float = 0.0        # evaluate an EMA of the weights of this decay (e.g. 0.999; 0: the weights)
divergence_ratio: float = 10.0          # "diverged" when a batch loss exceeds this times the first one
measure: list[str] = []                 # measurements taken after training, from MEASUREMENTS
measure_train_size: Optional[int] = None # the first examples of the training set they use (None: all of it)
noise_scale_every: int = 0              # steps between two-batch noise-scale samples from micro-batches (0: off)
noise_scale_ema: float = 0.9            # EMA decay of those samples' |G|^2 and tr(Sigma) (history: noise_*_ema)
stability: bool = False                 # at each evaluation: sharpness, batch sharpness, noise along the top (history)
stability_batches: int = 16             # stability: mini-batches of batch_size its batch sharpness averages over
# --- reproducibility and execution
seed: int = 0                           # init, data order and probes get separate generators from this
device: str = "auto"                    # auto | cpu | cuda | cuda:N
threads: int = 1                        # torch CPU threads; 1 is fastest for small models (0: torch default)
checkpoint_every: int = 0               # steps between resumable checkpoints (0: none during the run)
save_checkpoint: bool = True            # keep the final weights in checkpoint.pt (for later measurements)
snapshot_at_tokens: list[float] = []    # save the state here for runs that branch from this trajectory
# --- experiment trackers
trackers: list[str] = []                # also log history and final metrics to: tensorboard, mlflow (docs/runs.md)
mlflow_tracking_uri: Optional[str] = None # mlflow's store: a folder, file: or sqlite: URI (None: runs/<sweep>/mlruns)

# --- where the run is written
runs_dir: str = "runs"                  # run directories go to RUNS_DIR/SWEEP/<run_id>/ (relative: to the project)
sweep: str = "notebook"                 # the folder for runs started from this notebook
run_dir: Optional[str] = None           # the exact run directory (a sweep sets it); None: RUNS_DIR/SWEEP/<run_id>

# %%
import matplotlib.pyplot as plt
import pandas as pd

from bsresearch.config import FIELD_NAMES, RunConfig, run_id
from bsresearch.paths import project_path
from bsresearch.plots import run_curves
from bsresearch.rundir import RunDir
from bsresearch.train import run

# the whole config from the parameters above: a bad value stops here with one line naming the field
cfg = RunConfig.from_dict({name: globals()[name] for name in FIELD_NAMES})
run_dir = project_path(run_dir) if run_dir else project_path(runs_dir) / sweep / run_id(cfg)
print(f"run {run_id(cfg)} -> {run_dir}")

# %%
# trains (a progress bar in JupyterLab), or returns the finished result already in run_dir;
# failures are recorded, not raised
result = run(cfg, run_dir)
print(result.summary())

# %%
history = pd.read_csv(run_dir / "history.csv")
derived = RunDir(run_dir).config().get("derived", {})
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5), layout="constrained")
run_curves(ax_loss, ax_acc, history, loss_unit=derived.get("loss_unit", "nats"))
fig.suptitle(f"{cfg.dataset} / {cfg.model}: batch {cfg.batch_size}, {cfg.optimizer} lr {cfg.lr:g}, "
             f"seed {cfg.seed} ({result.state})")
plt.show()
