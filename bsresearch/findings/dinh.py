"""Dinh et al. (2017), "Sharp Minima Can Generalize For Deep Nets": rescaling consecutive ReLU layers by
(a, 1/a) leaves the function unchanged but changes sharpness arbitrarily; adaptive sharpness does not move.

    same_function = relu_rescale(model, alpha=10.0)
    reparameterisation_plot(ax, table, {"phi": "Keskar phi", ...})

Setting and pre-registered test: docs/protocols.md#dinh.
"""
from __future__ import annotations

import copy

import matplotlib.pyplot as plt
import pandas as pd
import torch
import torch.nn as nn

WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d)


# Layers through which a positive rescaling passes unchanged: f(a x) = a f(x) for a > 0.
POSITIVELY_HOMOGENEOUS = (nn.ReLU, nn.Identity, nn.Flatten, nn.Unflatten, nn.MaxPool1d, nn.MaxPool2d,
                          nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AvgPool1d, nn.AvgPool2d)


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
    layer_a, layer_b = modules[first], modules[second]
    assert isinstance(layer_a, WEIGHTED) and isinstance(layer_b, WEIGHTED)
    with torch.no_grad():
        layer_a.weight.mul_(alpha)
        if layer_a.bias is not None:
            layer_a.bias.mul_(alpha)
        layer_b.weight.div_(alpha)
    return out


# ----------------------------------------------------------------------------- figures
def reparameterisation_plot(ax: plt.Axes, table: pd.DataFrame, measures: dict[str, str]) -> plt.Axes:
    """Each measure relative to its value at alpha = 1, against the rescaling alpha (log-log)."""
    base = table.set_index("alpha").loc[1.0]
    for column, label in measures.items():
        ax.plot(table["alpha"], table[column] / base[column], "o-", markersize=3, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1.0, color="0.6", linewidth=0.8)
    ax.set(xlabel="rescaling alpha (layer k x alpha, layer k+1 / alpha)", ylabel="value / value at alpha = 1")
    ax.legend(fontsize=8)
    return ax
