"""A training notebook of one's own for the sweep tests: a plain loop (a linear regression on fixed data) that
writes its run with bsresearch.runwriter.RunWriter, as a researcher's notebook would, and a project around it."""
from __future__ import annotations

from pathlib import Path

import nbformat
import yaml

PARAMETERS = '''batch_size = 8          # examples per step
learning_rate = 0.05
seed = 0
steps = 30
run_dir = None          # set by the sweep: where this run is written
gate = ""               # tests only: after its first step the loop waits until this file exists
'''

TRAINING = '''import os
import time

import torch

from bsresearch.runwriter import RunWriter

data = torch.Generator().manual_seed(0)
x = torch.randn(256, 4, generator=data)
y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(256, generator=data)
torch.manual_seed(seed)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
order = torch.Generator().manual_seed(seed)


def full_loss() -> float:
    with torch.no_grad():
        return float(((model(x).squeeze(1) - y) ** 2).mean())


with RunWriter(run_dir, {"batch_size": batch_size, "learning_rate": learning_rate, "seed": seed}) as run:
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x), (batch_size,), generator=order)
        loss = ((model(x[idx]).squeeze(1) - y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(step=step, examples=step * batch_size, train_loss=full_loss())
        while gate and step == 1 and not os.path.exists(gate):   # held mid-training until the test lets go
            time.sleep(0.05)
    run.finish(train_loss=full_loss(), test_loss=full_loss())
'''


def write_notebook(path: Path, parameters: str = PARAMETERS, training: str = TRAINING) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(training)]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def write_project(root: Path, spec: dict | None = None, name: str = "own") -> Path:
    """A project (pyproject.toml, experiments/, notebooks/own.ipynb) and its spec experiments/<name>.yaml over
    2 batch sizes x 2 seeds; returns the spec's path."""
    (root / "experiments").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[tool.bsresearch]\n")
    write_notebook(root / "notebooks" / "own.ipynb")
    raw = {"name": name, "notebook": "../notebooks/own.ipynb", "timeout": 300,
           "base": {"learning_rate": 0.05}, "grid": {"batch_size": [8, 32]}, "seeds": 2, **(spec or {})}
    path = root / "experiments" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
