"""A stand-in for the fused trainer, for the sweep tests: `train_group` trains each member with train.run,
one after another (the numbers a fused trainer must reproduce), and `fusion_blocker` fuses configs that
differ only in seed, lr, momentum and weight_decay.

Loaded at startup by every Python process of a test sweep (the runner, its workers, their kernels) when
this folder is on PYTHONPATH and BSRESEARCH_FUSED_STAND_IN is set; each call of train_group appends
`group_id n_members` to the file BSRESEARCH_FUSED_STAND_IN names.
"""
from __future__ import annotations

import os

SHAPE_FREE = ("seed", "lr", "momentum", "weight_decay")


def fusion_blocker(a, b):
    da, db = a.to_dict(), b.to_dict()
    differ = [k for k in da if k not in SHAPE_FREE and da[k] != db[k]]
    return None if not differ else f"differs in {', '.join(differ)}"


def train_group(cfgs, run_dirs=None, progress=None, group_id=None):
    from bsresearch.train import run
    log = os.environ.get("BSRESEARCH_FUSED_STAND_IN")
    if log:
        with open(log, "a") as f:
            f.write(f"{group_id} {len(cfgs)}\n")
    return [run(cfg, d, progress=False) for cfg, d in zip(cfgs, run_dirs or [None] * len(cfgs))]


def install() -> None:
    import bsresearch.fused as fused
    import bsresearch.fused.grouping as grouping
    fused.train_group = train_group  # type: ignore[attr-defined]
    grouping.default_blocker = lambda: fusion_blocker


if os.environ.get("BSRESEARCH_FUSED_STAND_IN"):
    install()
