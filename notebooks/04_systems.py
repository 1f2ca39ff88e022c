# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 04 · Systems: throughput, memory and the batch size to use
#
# Which batch size is fastest on this machine, how large fits, and which one reaches a target loss soonest?
# Throughput and peak memory per batch size (with the out-of-memory boundary), the largest batch that fits,
# fp32 vs bf16 (vs fp16 on CUDA) and SGD vs Adam, a gradient-accumulation plan for a batch larger than memory
# allows, and a recommendation that combines the throughput curve with a measured gradient noise scale:
# steps to target S = S_min (1 + B_simple / B), time = S x seconds per step.
#
# Memory on CUDA comes from the allocator's peak; on a CPU it is a best-effort accounting (parameters,
# gradients, optimizer state, inputs, tensors saved for backward; see `bsresearch/systems/memory.py`).
# Inputs are synthetic tensors of the dataset's shape, so any dataset name works here for timing.

# %% tags=["parameters"]
# Parameters (papermill injects overrides after this cell).
from typing import Optional

model: str = "cnn1d"                      # mlp | cnn1d | convnet | resnet, or your own as FILE.py:NAME
model_kwargs: dict = {}                   # keyword arguments for your model factory
dataset: str = "mnist1d"                  # mnist1d, cifar10, fashion_mnist, synthetic, or FILE.py:NAME
loss: str = "cross_entropy"               # cross_entropy, mse, ... or FILE.py:NAME
precisions: list = ["fp32", "bf16"]       # fp16 needs CUDA
optimizer: str = "sgd"                    # sgd | adam | adamw
batch_sizes: list = [2 ** k for k in range(3, 13)]  # swept for memory and throughput (stops at the first OOM)
search_limit: int = 2 ** 16               # the largest-batch search never tries more
memory_budget: Optional[str] = "64MiB"    # cap: CUDA allocator fraction, CPU fitted memory model; None: the device
device: str = "auto"                      # auto | cpu | cuda | cuda:N
warmup: int = 3                           # untimed steps before timing
repeats: int = 5                          # timed repeats (the median is reported)
min_seconds: float = 0.05                 # each repeat lasts at least this long
target_batch_size: int = 2 ** 14          # the batch size a study wants: the accumulation plan reaches it
b_simple: Optional[float] = None          # a measured gradient noise scale (examples); None: measure it below
noise_steps: int = 300                    # training steps before measuring B_simple (when b_simple is None)
noise_examples: int = 2000                # training examples B_simple is computed over
out_dir: str = "reports/systems"          # figures go here (relative: to the project)
tag: str = "nb04"                         # file name stem

# %%
import matplotlib.pyplot as plt

from bsresearch import run
from bsresearch.data import resident_dataset_for
from bsresearch.losses import loss_for
from bsresearch.noise import gradient_noise_scale
from bsresearch.paths import project_path
from bsresearch.plots import save_figure
from bsresearch.plots.systems import bench_figure, memory_breakdown_plot, precision_plot, recommendation_plots
from bsresearch.runtime import resolve_device, set_threads
from bsresearch.sizes import parse_bytes
from bsresearch.systems import (
    compare_precisions,
    device_label,
    model_workload,
    plan_for_budget,
    recommend_batch_size,
    run_bench,
)

dev = resolve_device(device)
set_threads(1)
budget = parse_bytes(memory_budget) if memory_budget else None
own = {"model_kwargs": model_kwargs} if model_kwargs else {}
workloads = [model_workload(model, precision=p, optimizer=optimizer, dataset=dataset, loss=loss, **own)
             for p in precisions]
out = project_path(out_dir)
label = device_label(dev)
print(dev, label, "budget", budget)

# %% [markdown]
# ## Throughput and memory vs batch size, and the largest batch that fits

# %%
bench = run_bench(workloads, batch_sizes, dev, memory_budget=budget, search_limit=search_limit,
                  warmup=warmup, repeats=repeats, min_seconds=min_seconds)
fig = bench_figure(bench.table, bench.summary, budget)
save_figure(fig, out / f"{tag}_bench_{label}", f"{model} on {dataset}-shaped inputs, {label}: throughput and peak "
            f"memory vs batch size; x: first out-of-memory size, dashed: largest batch found by search")
bench.summary

# %%
fig, ax = plt.subplots(figsize=(6, 4))
memory_breakdown_plot(ax, bench.table[bench.table["precision"] == precisions[0]])
ax.set_title(f"{model} {precisions[0]}: what the peak is made of")
{label: (f.fixed_bytes, f.per_example_bytes, f.rms_residual_bytes) for label, f in bench.fits.items()}

# %% [markdown]
# ## Precision and optimizer: one table

# %%
ok = bench.table[(bench.table["status"] == "ok") & (bench.table["precision"] == precisions[0])]
compare_at = int(ok["batch_size"].max())
comparison = compare_precisions(workloads[0], [compare_at], dev, precisions=("fp32", "bf16", "fp16"),
                                optimizers=("sgd", "adam"), warmup=warmup, repeats=repeats, min_seconds=min_seconds)
fig, ax = plt.subplots(figsize=(7, 3.5))
precision_plot(ax, comparison)
comparison[["precision", "optimizer", "batch_size", "status", "examples_per_second", "peak_bytes",
            "optimizer_bytes", "activation_bytes"]]

# %% [markdown]
# ## A batch larger than memory allows: the accumulation plan

# %%
fit = bench.fits[workloads[0].label]
plan_budget = budget or int(fit.predict(max(batch_sizes)))
plan = plan_for_budget(target_batch_size, fit, plan_budget)
print(plan)
print("RunConfig for the study:", plan.apply(workloads[0].cfg).micro_batch_size, "x", plan.accumulation_steps)

# %% [markdown]
# ## The recommendation
#
# The gradient noise scale B_simple (exact per-example, after a short training run unless given) stands in
# for McCandlish et al.'s B_noise. Steps to target S = S_min (1 + B_simple/B); time = S x seconds per step;
# S_min = 1 here, so times are relative. The recommended size maximises examples/second x statistical efficiency.

# %%
if b_simple is None:
    cfg = workloads[0].cfg.replace(batch_size=32, budget="steps", budget_amount=noise_steps, eval_schedule="every",
                                   eval_every=noise_steps, device=str(dev), save_checkpoint=False)
    trained = run(cfg, progress=False)
    data = resident_dataset_for(cfg, dev)
    b_simple = gradient_noise_scale(trained.model, data.x_train[:noise_examples], data.y_train[:noise_examples],
                                    loss_fn=loss_for(loss)).b_simple
print("B_simple", b_simple)
train = bench.table[(bench.table["mode"] == "train") & (bench.table["status"] == "ok")
                    & (bench.table["precision"] == precisions[0])]
rec = recommend_batch_size(train, b_simple)
fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
recommendation_plots(axes, rec.table, rec.batch_size)
fig.tight_layout()
save_figure(fig, out / f"{tag}_recommendation_{label}", f"{model} {precisions[0]} on {label}: examples/s, "
            f"statistical efficiency 1/(1 + B/B_simple) with B_simple = {b_simple:.3g}, and their product; "
            f"recommended batch size {rec.batch_size}")
print("recommended batch size", rec.batch_size)
rec.table[["batch_size", "examples_per_second", "statistical_efficiency", "steps_to_target", "predicted_seconds"]]
