# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # A fused group of runs
#
# Several runs that differ only in seed and in hyperparameters that change neither tensor shapes nor the
# data pipeline, trained at once by `bsresearch.fused.train_group` (one vmapped model over the members).
# Each member's run directory gets what `bsresearch.train.run` would write for it alone, plus the group
# id in `status.json`. A sweep (`bsresearch sweep SPEC`, `--fuse auto`) executes this notebook with
# papermill, once per group, injecting the members' configs and run directories after the parameters
# cell. On CUDA the members are trained in chunks the memory model says fit, and a chunk that still runs
# out of memory is split in two and retried, down to single runs, which record "oom".

# %% tags=["parameters"]
from typing import Optional

# The members: a JSON list of RunConfig dicts, one per run; fields not given take their defaults.
configs_json: str = '[{"seed": 0, "budget_amount": 2}, {"seed": 1, "budget_amount": 2}]'  # two seeds, 2 epochs
run_dirs: Optional[list] = None  # one run directory per member (None: train without writing any)
group_id: Optional[str] = None   # recorded in each member's status.json
progress: bool = False           # a progress bar per chunk

# %%
import json

import pandas as pd

from bsresearch.config import RunConfig
from bsresearch.fused import train_group

# every member's config, field by field: a bad value stops here with a message naming the field
cfgs = [RunConfig.from_dict(d) for d in json.loads(configs_json)]
results = train_group(cfgs, run_dirs, progress=progress, group_id=group_id)

# %%
# one line per member: its state and final numbers (the curves are in each run directory's history.csv)
pd.DataFrame([{"seed": c.seed, "lr": c.lr, "state": r.state, "steps": r.metrics.get("steps"),
               "train_loss": r.metrics.get("train_loss"), "test_acc": r.metrics.get("test_acc"),
               "run_dir": str(r.run_dir) if r.run_dir else None} for c, r in zip(cfgs, results)])
