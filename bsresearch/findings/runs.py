"""Measurements over finished runs' weights: what a findings notebook calls after `results.load` when a
number needs the trained model (sharpness of every run, say). Needs torch.

    table = measure_runs(ok, lambda model, data, cfg: {"phi": keskar_sharpness(model, data.x_train, ...).phi})
    table = measure_each_run(points, lambda run, model, data, cfg: {"seed": run["seed"], "b": noise(model, data)})

measure_runs keys each row by run_id; measure_each_run hands the measurement the run's row of the table
too (its seed, its steps: what a row keeps, or a generator's seed) and keeps exactly what it returns: a row, or
a list of rows for several measurements of one run.
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


Row = dict[str, Any]


def measure_each_run(runs: pd.DataFrame,
                     measure: Callable[[pd.Series, nn.Module, Dataset, RunConfig], Row | list[Row]],
                     device: torch.device | str = "cpu") -> pd.DataFrame:
    """Apply `measure(run, model, data, cfg)` to the final weights of every run in `runs` (a table from
    `results.load`, with its `run_dir` column), in the table's order; `run` is the run's row. Returns what
    `measure` returned, one row per dict: a dict per run, or a list of them (several measurements of one run:
    Dinh's rescalings). The data is loaded once per (dataset, data_dir, train_size), as tensors on `device`.
    Runs without a checkpoint.pt raise FileNotFoundError (they were not saved with save_checkpoint)."""
    data_for = _DataCache(device)
    rows: list[Row] = []
    for _, run in runs.iterrows():
        model, cfg = load_trained_model(run["run_dir"], device)
        measured = measure(run, model, data_for(cfg), cfg)
        rows += measured if isinstance(measured, list) else [measured]
    return pd.DataFrame(rows)


def measure_runs(runs: pd.DataFrame, measure: Callable[[nn.Module, Dataset, RunConfig], dict[str, Any]],
                 device: torch.device | str = "cpu") -> pd.DataFrame:
    """Apply `measure(model, data, cfg) -> dict` to the final weights of every run in `runs` (a table from
    `results.load`, with its `run_dir` column); returns one row per run: run_id plus the measured values.
    Runs without a checkpoint.pt raise FileNotFoundError (they were not saved with save_checkpoint)."""
    return measure_each_run(runs, lambda run, model, data, cfg: {"run_id": run["run_id"], **measure(model, data, cfg)},
                            device)
