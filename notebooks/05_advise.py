# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 05 · Batch-size advice for your own model
#
# Which batch size for *my* model on *my* GPU, how large fits, which learning rate goes with it, and where
# more examples per step stop buying progress? `bsresearch.advise.advise` answers for any `nn.Module`, data
# of (input, target) pairs and mean-reduced loss: it measures peak memory and synchronised throughput per
# batch size, searches the largest batch that fits (out-of-memory safe), measures the gradient noise scale
# B_simple at the given weights, and recommends the batch that maximises
# examples/s x statistical efficiency 1 / (1 + B / B_simple), with its accumulation plan and learning rate.
#
# Name your model, dataset and loss below exactly as `bsresearch train` takes them: a built-in name, or your
# own code as `FILE.py:NAME` (a factory; `model_kwargs` and `dataset_kwargs` are its keyword arguments). The
# defaults are the examples shipped in `examples/`: a small transformer language model on synthetic tokens
# (token-level cross-entropy), and a regression MLP (mean squared error) under a memory budget small enough
# that the largest batches need gradient accumulation. The same from a terminal:
# `bsresearch advise --model examples/tiny_transformer.py:make_model
# --dataset examples/tiny_transformer.py:make_data --optimizer adamw --lr 0.001 --out runs/advise`.

# %% tags=["parameters"]
# Parameters (papermill injects overrides after this cell). Paths are relative to the repository root.
from typing import Optional

model: str = "examples/tiny_transformer.py:make_model"   # a built-in model or FILE_OR_MODULE:FACTORY
model_kwargs: dict = {}                                  # keyword arguments for the model factory
dataset: str = "examples/tiny_transformer.py:make_data"  # a built-in dataset or FILE_OR_MODULE:FACTORY
loss: str = "cross_entropy"                              # cross_entropy, mse, l1, smooth_l1 or FILE_OR_MODULE:FUNC
optimizer: str = "adamw"                                 # sgd (momentum 0.9), adam or adamw
lr: float = 0.001                                        # the learning rate tuned at base_batch_size
base_batch_size: int = 16                                # the batch size lr was tuned at
device: str = "auto"                                     # auto, cpu or cuda
memory_budget: Optional[str] = None                      # e.g. 4GiB; None for the device's memory
batch_sizes: list = [8, 16, 32, 64, 128, 256]            # batch sizes to measure
train_steps: int = 30                                    # the noise scale's EMA along this many steps (0: skip)
mlp_model: str = "examples/regression_mlp.py:make_model"  # a second model to advise on ("" to skip)
mlp_dataset: str = "examples/regression_mlp.py:make_data"
mlp_loss: str = "mse"
mlp_memory_budget: Optional[str] = "160KiB"              # small on purpose: the largest batches accumulate
out_dir: Optional[str] = None                            # where to save the figures (None: show only)

# %%
import matplotlib.pyplot as plt

from bsresearch.advise import advise_config
from bsresearch.advise.plot import advice_figure
from bsresearch.config import RunConfig
from bsresearch.paths import project_path
from bsresearch.runtime import set_threads

set_threads(1)
cfg = RunConfig(model=model, model_kwargs=model_kwargs, dataset=dataset, loss=loss, optimizer=optimizer, lr=lr,
                base_batch_size=base_batch_size, device=device)
advice = advise_config(cfg, memory_budget=memory_budget, batch_sizes=batch_sizes, train_steps=train_steps)
print(advice.summary())

# %% [markdown]
# ## Throughput, statistical efficiency, their product, and memory
# The recommended batch (red) maximises the product: beyond it, the examples a larger batch processes per
# second are mostly spent averaging away noise that was already small. The memory panel shows the peak of a
# training step (the real allocator on CUDA, tensor accounting on the CPU) and the largest batch that fits.

# %%
fig = advice_figure(advice)
if out_dir:
    out_dir = project_path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / "advice_model.png", dpi=150, bbox_inches="tight")
plt.show()
advice.table[["batch_size", "micro_batch_size", "accumulation_steps", "examples_per_second", "peak_bytes",
              "statistical_efficiency", "effective_examples_per_second", "lr", "beyond_critical"]]

# %% [markdown]
# ## The noise scale along a short training run
# B_simple measured at initialisation is usually small; it grows as the loss falls, and with it the batch
# size worth using. A short run of the training loop followed it here, with the trainer's two-batch estimator
# and EMA.

# %%
if advice.noise_history is not None:
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(advice.noise_history["step"], advice.noise_history["b_simple_ema"], label="two-batch EMA")
    ax.axhline(advice.b_simple, color="grey", linestyle=":", label=f"at the initial weights ({advice.noise_method})")
    ax.set_xlabel("step")
    ax.set_ylabel("B_simple (examples)")
    ax.legend(fontsize=8)
    plt.show()

# %% [markdown]
# ## A regression MLP under a small memory budget
# Batches beyond the largest that fits run as micro-batches with gradient accumulation (the table's
# accumulation_steps); their throughput is measured that way, so the recommendation accounts for it.

# %%
if mlp_model:
    mlp = RunConfig(model=mlp_model, dataset=mlp_dataset, loss=mlp_loss, lr=0.01, base_batch_size=batch_sizes[0],
                    device=device)
    mlp_advice = advise_config(mlp, memory_budget=mlp_memory_budget, batch_sizes=batch_sizes)
    print(mlp_advice.summary())
    fig = advice_figure(mlp_advice)
    if out_dir:
        fig.savefig(out_dir / "advice_mlp.png", dpi=150, bbox_inches="tight")
    plt.show()
