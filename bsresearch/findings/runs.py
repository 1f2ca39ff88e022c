"""Measurements over finished runs' weights: what a findings notebook calls after `results.load` when a
number needs the trained model (sharpness of every run, say). Needs torch.

    table = measure_runs(ok, lambda model, data, cfg: {"phi": keskar_sharpness(model, data.x_train, ...).phi})
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
import torch
import torch.nn as nn

from ..config import RunConfig
from ..data import Dataset, resident_dataset_for
from ..train import load_trained_model


class _DataCache:
    """One Dataset per (dataset, data_dir, train_size) on the device: runs of a sweep share their data."""

    def __init__(self, device: torch.device | str):
        self.device = device
        self.cache: dict[tuple[Any, ...], Dataset] = {}

    def __call__(self, cfg: RunConfig) -> Dataset:
        key = (cfg.dataset, cfg.data_dir, cfg.train_size)
        if key not in self.cache:
            self.cache[key] = resident_dataset_for(cfg, self.device)
        return self.cache[key]


def measure_runs(runs: pd.DataFrame, measure: Callable[[nn.Module, Dataset, RunConfig], dict[str, Any]],
                 device: torch.device | str = "cpu") -> pd.DataFrame:
    """Apply `measure(model, data, cfg) -> dict` to the final weights of every run in `runs` (a table from
    `results.load`, with its `run_dir` column); returns one row per run: run_id plus the measured values.
    Runs without a checkpoint.pt raise FileNotFoundError (they were not saved with save_checkpoint)."""
    data_for = _DataCache(device)
    rows = []
    for run_id, run_dir in zip(runs["run_id"], runs["run_dir"]):
        model, cfg = load_trained_model(run_dir, device)
        rows.append({"run_id": run_id, **measure(model, data_for(cfg), cfg)})
    return pd.DataFrame(rows)
