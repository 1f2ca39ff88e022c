"""The example of a training notebook of one's own that `bsresearch init` writes into a project (item: sweeps of
the researcher's own training): notebooks/own_training.ipynb (and its jupytext .py), a plain training loop over
the project's models/my_model.py that writes its run with bsresearch.runwriter.RunWriter, and
experiments/own_training.yaml, its sweep over batch size and learning rate. No torch import here.
"""
from __future__ import annotations

import json

NAME = "own_training"

# (kind, source, tags) of each cell, in order
CELLS: list[tuple[str, str, list[str]]] = [
    ("markdown", """\
# Your own training, swept by bsresearch

A training loop of your own (here a plain loop over `models/my_model.py`; a Hugging Face Trainer or Lightning
works the same way with their callbacks given `run_dir`). `bsresearch sweep experiments/own_training.yaml`
executes this notebook once per point of the spec's grid: the spec may set only the names this parameters
cell assigns, the sweep sets `seed` and `run_dir`, and the run is written into `run_dir` with
`bsresearch.runwriter.RunWriter` (config.json, status.json, history.csv, metrics.json), so that the sweep
resumes, survives a killed worker, and `bsresearch report experiments/own_training.yaml` draws it.

Opened by hand, it trains one run into `runs/own_training/by_hand/`.""", []),
    ("code", """\
batch_size = 32          # examples per step
learning_rate = 0.05     # SGD's
epochs = 4               # passes over the training split
seed = 0                 # the initial weights and the order of the examples (the sweep sets it from `seeds`)
run_dir = None           # where the run is written (the sweep sets it); None: runs/own_training/by_hand/""",
     ["parameters"]),
    ("code", """\
import sys

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn.functional as F

from bsresearch.paths import project_path
from bsresearch.runwriter import RunWriter

sys.path.insert(0, str(project_path("models")))   # the project's models/, from any working directory
from my_model import make_data, make_model  # noqa: E402

data = make_data(n=2000)
x, y = data.tensors
split = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))   # the same split for every run
test, train = split[:400], split[400:]
torch.manual_seed(seed)
model = make_model(hidden=64)
optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
order = torch.Generator().manual_seed(seed)


def evaluate(rows: torch.Tensor) -> tuple[float, float]:
    \"\"\"Mean cross-entropy (nats) and accuracy over `rows`.\"\"\"
    with torch.no_grad():
        out = model(x[rows])
        return F.cross_entropy(out, y[rows]).item(), (out.argmax(1) == y[rows]).float().mean().item()


run_dir = run_dir or project_path("runs/own_training/by_hand")
parameters = {"batch_size": batch_size, "learning_rate": learning_rate, "epochs": epochs, "seed": seed}
with RunWriter(run_dir, parameters) as run:
    step = examples = 0
    for epoch in range(1, epochs + 1):
        for batch in train[torch.randperm(len(train), generator=order)].split(batch_size):
            loss = F.cross_entropy(model(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step, examples = step + 1, examples + len(batch)
        (train_loss, train_acc), (test_loss, test_acc) = evaluate(train), evaluate(test)
        run.log(step=step, epoch=epoch, examples=examples, train_loss=train_loss, test_loss=test_loss,
                train_acc=train_acc, test_acc=test_acc)
    run.finish(train_loss=train_loss, test_loss=test_loss, train_acc=train_acc, test_acc=test_acc, steps=step)
print(f"{run_dir}: test accuracy {test_acc:.3f}, test loss {test_loss:.4f} nats after {step} steps")""", []),
    ("code", """\
history = pd.read_csv(f"{run_dir}/history.csv")
fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(8, 3), layout="constrained")
ax_loss.plot(history["examples"], history["train_loss"], label="train")
ax_loss.plot(history["examples"], history["test_loss"], "--", label="test")
ax_loss.set(xlabel="examples seen", ylabel="loss (nats)", yscale="log")
ax_acc.plot(history["examples"], history["train_acc"], label="train")
ax_acc.plot(history["examples"], history["test_acc"], "--", label="test")
ax_acc.set(xlabel="examples seen", ylabel="accuracy")
ax_loss.legend()
plt.show()""", []),
]

SPEC = f"""\
# A sweep of your own training notebook (not bsresearch's run template): every point of the grid, for every
# seed, executes ../notebooks/{NAME}.ipynb with these values in its parameters cell, and the sweep's `run_dir`.
#   bsresearch sweep experiments/{NAME}.yaml --dry-run      # what would run
#   bsresearch sweep experiments/{NAME}.yaml --workers 2    # runs/{NAME}/<run_id>/, resumable
#   bsresearch report experiments/{NAME}.yaml               # final metrics against batch size and lr: reports/{NAME}/
name: {NAME}
description: a training loop of one's own over models/my_model.py, at 2 batch sizes and 2 learning rates
notebook: ../notebooks/{NAME}.ipynb   # its parameters cell declares the names below (run_dir and seed: the sweep's)
timeout: 900                  # seconds per run
base: {{epochs: 4}}
grid:                         # any name the notebook's parameters cell assigns
  batch_size: [16, 128]
  learning_rate: [0.02, 0.1]
seeds: 2
"""


def notebook_json() -> str:
    """The .ipynb of the example, in nbformat 4's layout, with the kernel every project notebook names."""
    cells = [{"cell_type": kind, "id": f"{NAME}-{k}", "metadata": {"tags": tags} if tags else {},
              "source": source.splitlines(keepends=True),
              **({"execution_count": None, "outputs": []} if kind == "code" else {})}
             for k, (kind, source, tags) in enumerate(CELLS)]
    nb = {"cells": cells, "metadata": {"kernelspec": {"display_name": "bsresearch", "language": "python",
                                                      "name": "bsresearch"},
                                       "jupytext": {"cell_metadata_filter": "tags,-all",
                                                    "notebook_metadata_filter": "kernelspec,-jupytext"}},
          "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def notebook_script() -> str:
    """The jupytext percent-format .py of the example (what a notebook saved in JupyterLab keeps beside it)."""
    parts = ["# ---\n# jupyter:\n#   kernelspec:\n#     display_name: bsresearch\n#     language: python\n"
             "#     name: bsresearch\n# ---\n"]
    for kind, source, tags in CELLS:
        marker = "# %% [markdown]" if kind == "markdown" else "# %%" + (f" tags={json.dumps(tags)}" if tags else "")
        body = "\n".join(f"# {line}".rstrip() for line in source.splitlines()) if kind == "markdown" else source
        parts.append(f"{marker}\n{body}\n")
    return "\n".join(parts)


def files() -> dict[str, str]:
    """What `bsresearch init` writes for the example, by path relative to the project."""
    return {f"notebooks/{NAME}.ipynb": notebook_json(), f"notebooks/{NAME}.py": notebook_script(),
            f"experiments/{NAME}.yaml": SPEC}
