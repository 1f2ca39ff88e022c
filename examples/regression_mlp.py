"""A regression MLP on a synthetic nonlinear target, for `bsresearch advise`.

    bsresearch advise --model examples/regression_mlp.py:make_model \
                      --data examples/regression_mlp.py:make_data --loss mse --out runs/advise_mlp

make_model() -> MLP: x (batch, in_features) float32 -> (batch, 1). make_data() -> a DataLoader over
(x, y) with y (n, 1) float32; the loss is the mean squared error (mean over the batch).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def make_model(in_features: int = 8, width: int = 64, depth: int = 2) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(in_features if i == 0 else width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 1))


def make_data(n: int = 1024, in_features: int = 8, noise: float = 0.3, seed: int = 0) -> DataLoader:
    """y = sin(x . w) + 0.5 (x . v)^2 / in_features + noise; x standard normal. A DataLoader (batch 64),
    as a training script would have: advise reads its dataset, not its batches."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_features, generator=gen)
    w, v = torch.randn(in_features, generator=gen), torch.randn(in_features, generator=gen)
    y = torch.sin(x @ w) + 0.5 * (x @ v) ** 2 / in_features + noise * torch.randn(n, generator=gen)
    return DataLoader(TensorDataset(x, y.unsqueeze(1)), batch_size=64, shuffle=True)
