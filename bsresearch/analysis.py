"""Analysis of finished runs that needs their weights (and so torch): what report notebooks call after
`results.load`. Torch-free analysis lives in results.py.

    table = measure_runs(ok, lambda model, data, cfg: {"phi": keskar_sharpness(model, data.x_train, ...).phi})
    curve = interpolate_runs(small_batch_run_dir, large_batch_run_dir)       # Keskar's parametric plot
    same_function = relu_rescale(model, alpha=10.0)                         # Dinh et al.'s reparameterisation
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn as nn

from .config import ConfigError, RunConfig
from .data import Dataset, dataset_for
from .measure.landscape import DEFAULT_ALPHAS, interpolate
from .train import load_trained_model

WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d)
# Layers through which a positive rescaling passes unchanged: f(a x) = a f(x) for a > 0.
POSITIVELY_HOMOGENEOUS = (nn.ReLU, nn.Identity, nn.Flatten, nn.Unflatten, nn.MaxPool1d, nn.MaxPool2d,
                          nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AvgPool1d, nn.AvgPool2d)


class _DataCache:
    """One Dataset per (dataset, data_dir, train_size) on the device: runs of a sweep share their data."""

    def __init__(self, device: torch.device | str):
        self.device, self.cache = device, {}

    def __call__(self, cfg: RunConfig) -> Dataset:
        key = (cfg.dataset, cfg.data_dir, cfg.train_size)
        if key not in self.cache:
            self.cache[key] = dataset_for(cfg, self.device)
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


def interpolate_runs(run_dir_a: str | Path, run_dir_b: str | Path, alphas: Sequence[float] = DEFAULT_ALPHAS,
                     device: torch.device | str = "cpu") -> pd.DataFrame:
    """Loss and accuracy on the train and test sets along (1 - alpha) theta_a + alpha theta_b between two
    runs' final weights (Keskar et al.'s parametric plot: a = small batch, b = large batch), eval-mode
    BatchNorm with interpolated buffers. Both runs must use the same dataset and architecture."""
    model_a, cfg_a = load_trained_model(run_dir_a, device)
    model_b, cfg_b = load_trained_model(run_dir_b, device)
    same = ("dataset", "data_dir", "train_size", "model", "width", "depth", "batchnorm")
    differ = [f for f in same if getattr(cfg_a, f) != getattr(cfg_b, f)]
    if differ:
        raise ConfigError(f"interpolate_runs needs runs on the same data and architecture; they differ in {differ}")
    return interpolate(model_a, model_b, dataset_for(cfg_a, device), alphas)


def relu_rescale(model: nn.Module, alpha: float, pair: int = 0) -> nn.Module:
    """A copy of `model` computing the same function with different weights (Dinh et al. 2017).

    The `pair`-th pair of consecutive weighted layers (Linear/Conv, in module order) is rescaled: the first
    layer's weight and bias are multiplied by alpha > 0, the second layer's weight divided by alpha. This
    leaves the outputs unchanged when only positively homogeneous layers (ReLU, pooling, flatten, identity)
    sit between the two, which is checked: a BatchNorm between them raises ValueError.
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be positive; got {alpha!r}")
    out = copy.deepcopy(model)
    modules = [m for m in out.modules() if not list(m.children())]  # leaves, in forward order for Sequentials
    weighted = [i for i, m in enumerate(modules) if isinstance(m, WEIGHTED)]
    if pair + 1 >= len(weighted):
        raise ValueError(f"pair {pair} needs {pair + 2} weighted layers; the model has {len(weighted)}")
    first, second = weighted[pair], weighted[pair + 1]
    between = [m for m in modules[first + 1:second] if not isinstance(m, POSITIVELY_HOMOGENEOUS)]
    if between:
        raise ValueError(f"layers between the pair are not positively homogeneous: {between}")
    with torch.no_grad():
        modules[first].weight.mul_(alpha)
        if modules[first].bias is not None:
            modules[first].bias.mul_(alpha)
        modules[second].weight.div_(alpha)
    return out
