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


HF_PARAMETERS = '''batch_size = 4          # sequences per optimizer step
learning_rate = 1e-2
seed = 0
steps = 6
run_dir = None          # set by the sweep: the callback writes the run there
gate = ""               # tests only: after its second step the Trainer waits until this file exists
'''

# A Hugging Face Trainer on a tiny Llama built from a config (random weights, offline), with bsresearch's
# callback writing the run into run_dir, as a researcher's notebook would.
HF_TRAINING = '''import os
import time

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from bsresearch.integrations.hf import BatchSizeCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 32, (64, 12), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Gate(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        # held after step 2 until the test lets go (the callback writes a step's row once the next has run)
        while gate and state.global_step == 2 and not os.path.exists(gate):
            time.sleep(0.05)


torch.manual_seed(seed)
model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))
args = TrainingArguments(output_dir=f"{run_dir}/trainer", per_device_train_batch_size=batch_size, max_steps=steps,
                         learning_rate=learning_rate, seed=seed, report_to="none", save_strategy="no",
                         logging_steps=1, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
callback = BatchSizeCallback(run_dir=run_dir, parameters={"batch_size": batch_size, "learning_rate": learning_rate,
                                                          "seed": seed})
Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback, Gate()]).train()
'''


def write_notebook(path: Path, parameters: str = PARAMETERS, training: str = TRAINING) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(parameters, metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(training)]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def write_project(root: Path, spec: dict | None = None, name: str = "own", trainer: str = "loop") -> Path:
    """A project (pyproject.toml, experiments/, notebooks/own.ipynb: a plain loop, or with trainer "hf" a Hugging
    Face Trainer) and its spec experiments/<name>.yaml over 2 batch sizes x 2 seeds; returns the spec's path."""
    (root / "experiments").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[tool.bsresearch]\n")
    cells = (HF_PARAMETERS, HF_TRAINING) if trainer == "hf" else (PARAMETERS, TRAINING)
    write_notebook(root / "notebooks" / "own.ipynb", *cells)
    sizes = [4, 8] if trainer == "hf" else [8, 32]
    raw = {"name": name, "notebook": "../notebooks/own.ipynb", "timeout": 600,
           "base": {"learning_rate": 0.05}, "grid": {"batch_size": sizes}, "seeds": 2, **(spec or {})}
    path = root / "experiments" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path
