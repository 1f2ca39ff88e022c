# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 06 · Your own model, from a file to a report
#
# Point `model` and `dataset` at your own code as `FILE.py:NAME` (a model factory, a dataset factory; their
# keyword arguments in `model_kwargs` and `dataset_kwargs`) and run the notebook: one run, then a sweep over
# batch sizes and seeds, then its report, whose figures label the loss in your model's units. The defaults
# are the language-model example, `examples/lm.py` (a GPT on English text, written as a user writes a
# model); the manual is docs/own-model.md. The same from a terminal:
# `bsresearch train --model examples/lm.py:make_model --dataset examples/lm.py:make_data`, then
# `bsresearch sweep experiments/own_model.yaml` and `bsresearch report experiments/own_model.yaml`.

# %% tags=["parameters"]
# Parameters (papermill injects overrides after this cell). Paths are relative to the project.
model: str = "examples/lm.py:make_model"        # a built-in model, or FILE.py:NAME of your model factory
model_kwargs: dict = {"context": 64, "width": 64, "depth": 2, "heads": 2}  # its keyword arguments
dataset: str = "examples/lm.py:make_data"       # a built-in dataset, or FILE.py:NAME of your dataset factory
dataset_kwargs: dict = {"context": 64}          # its keyword arguments
loss: str = "cross_entropy"                     # cross_entropy, mse, ..., or FILE.py:NAME of loss(output, target)
optimizer: str = "adamw"                        # sgd | adam | adamw
lr: float = 2e-3                                # the same at every batch size here
budget: str = "tokens"                          # epochs | steps | examples | tokens
budget_amount: float = 200_000                  # the same budget at every batch size
batch_sizes: list = [4, 16, 64]                 # the sweep's grid
eval_examples: int = 512                        # examples of each split the losses are evaluated on (0: all)
seeds: int = 2                                  # seeds per batch size
workers: int = 2                                # worker processes for the sweep
sweep: str = "own_model_notebook"               # the sweep's name: runs in RUNS_DIR/SWEEP, report in REPORTS_DIR/SWEEP
runs_dir: str = "runs"                          # relative: to the project
reports_dir: str = "reports"                    # relative: to the project (git ignores nothing here: choose)
device: str = "auto"                            # auto | cpu | cuda

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, display

from bsresearch.config import RunConfig, run_id
from bsresearch.paths import project_path
from bsresearch.plots import run_curves
from bsresearch.report import run_report
from bsresearch.rundir import RunDir
from bsresearch.sweep import parse_spec, run_sweep
from bsresearch.train import run

base = dict(model=model, model_kwargs=model_kwargs, dataset=dataset, dataset_kwargs=dataset_kwargs, loss=loss,
            optimizer=optimizer, lr=lr, budget=budget, budget_amount=budget_amount, eval_schedule="log",
            eval_per_decade=6, eval_train_size=eval_examples or None, eval_test_size=eval_examples or None,
            device=device, save_checkpoint=False)
cfg = RunConfig(**base, batch_size=batch_sizes[len(batch_sizes) // 2])   # a mistake stops here, in one line
runs = project_path(runs_dir)

# %% [markdown]
# ## One run
# One batch of two examples goes through your model, the loss and the backward pass before the first step; the
# run directory records your files' sha256, so an edited model file is a new run.

# %%
single = runs / f"{sweep}_single" / run_id(cfg)
result = run(cfg, single)
print(result.summary())
derived = RunDir(single).config()["derived"]
fig, (ax_loss, ax_second) = plt.subplots(1, 2, figsize=(10, 3.5), layout="constrained")
run_curves(ax_loss, ax_second, pd.read_csv(single / "history.csv"), loss_unit=derived["loss_unit"])
plt.show()

# %% [markdown]
# ## A sweep over batch sizes and seeds
# The same fields as a spec file (`experiments/own_model.yaml` is this sweep as YAML), executed by the library in
# worker processes; finished runs are kept, so running the cell again trains only what is missing.

# %%
spec = parse_spec({"name": sweep, "base": {**base, "model": cfg.model, "dataset": cfg.dataset, "loss": cfg.loss},
                   "grid": {"batch_size": batch_sizes}, "seeds": seeds}, base_dir=project_path())   # as found above
report = run_sweep(spec, runs, executor="local", engine="library", workers=workers)
print(report.summary())

# %% [markdown]
# ## Its report
# The generic sweep report (`notebooks/10_sweep_report`, packaged with bsresearch) over the sweep: final losses
# (or accuracies, for a classifier) against batch size with 95% intervals over seeds, learning curves, a summary
# table. A report made from uncommitted code says so in every caption.

# %%
folder = run_report(spec, runs, project_path(reports_dir), allow_dirty=True)
for figure in ("metrics_vs_batch", "learning_curves"):
    display(Image(filename=str(folder / f"{figure}.png"), width=900))
print((folder / "summary.md").read_text())
