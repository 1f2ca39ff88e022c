"""Keskar et al. (2017), "On Large-Batch Training for Deep Learning: Generalization Gap and Sharp Minima":
large batches converge to sharper minima that generalize worse. Needs torch (the trained weights).

    table = runs.measure_runs(ok, lambda model, data, cfg: {"phi": keskar_sharpness(...).phi})
    curve = interpolate_runs(small_batch_run_dir, large_batch_run_dir)       # the parametric plot
    interpolation_plot(ax_loss, ax_acc, curve)

Setting and pre-registered test: docs/protocols.md#keskar.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import torch

from ..config import ConfigError
from ..data import dataset_for
from ..measure.landscape import DEFAULT_ALPHAS, interpolate
from ..train import load_trained_model


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


# ----------------------------------------------------------------------------- figures
def interpolation_plot(ax_loss: plt.Axes, ax_acc: plt.Axes | None, table: pd.DataFrame,
                       a_label: str = "small batch", b_label: str = "large batch") -> None:
    """Keskar et al.'s parametric plot: loss (log scale) and accuracy along alpha for train and test; the
    table may hold several pairs of runs (e.g. one per seed): their mean is drawn, their range as a band.
    alpha 0 = a, alpha 1 = b."""
    for split, style in (("train", "-"), ("test", "--")):
        part = table[table["split"] == split].groupby("alpha")
        for ax, column in ((ax_loss, "loss"), (ax_acc, "accuracy")):
            if ax is None:
                continue
            mean, low, high = part[column].mean(), part[column].min(), part[column].max()
            ax.plot(mean.index, mean.values, style, color="C0" if column == "loss" else "C1", label=split)
            ax.fill_between(mean.index, low.values, high.values, alpha=0.2, color="C0" if column == "loss" else "C1")
    for ax, column in ((ax_loss, "cross-entropy"), (ax_acc, "accuracy")):
        if ax is None:
            continue
        for x, name in ((0, a_label), (1, b_label)):
            ax.axvline(x, color="0.6", linewidth=0.8)
            ax.annotate(name, (x, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                        textcoords="offset points", fontsize=8, color="0.4")
        ax.set(xlabel="alpha", ylabel=column)
        ax.legend(fontsize=8)
    ax_loss.set_yscale("log")
