"""Loss landscapes: 1-D interpolation between two models (Goodfellow et al.; Keskar et al.'s parametric
plot), and 1-D/2-D slices along filter-normalised random directions (Li et al. 2018) or along top
Hessian eigenvectors.

Results are tidy pandas tables, one row per (point, split): loss is the mean loss over the split (the
cross-entropy unless loss_fn is another mean-reduced loss), accuracy the fraction of targets correct where
the targets are class indices (NaN otherwise, a regressor's). Models are evaluated in eval mode (BatchNorm
running statistics, recorded in `table.attrs["bn_mode"]`); the models passed in are left exactly as found.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..config import ConfigError
from ..data import Dataset
from ..losses import class_indices, loss_for
from ..model_io import call, logits_of
from .curvature import top_eigenvalues
from .functional import (
    DEFAULT_CHUNK,
    Batches,
    LossFn,
    batches_of,
    buffers_of,
    flatten,
    generator_or_default,
    measuring,
    normal_like,
    parameters_of,
    unflatten,
)

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_ALPHAS = tuple(float(a) for a in np.linspace(-1.0, 2.0, 25))  # Keskar et al.: 25 points in [-1, 2]
SPLITS = ("train", "test")
Direction = dict[str, torch.Tensor] | torch.Tensor  # per-parameter tensors, or one flat vector


def _split(data: Dataset, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    return (data.x_train, data.y_train) if split == "train" else (data.x_test, data.y_test)


@torch.no_grad()
def _loss_and_accuracy(model: nn.Module, tensors: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                       chunk_size: int, loss_fn: LossFn) -> tuple[float, float]:
    """Mean loss and accuracy (NaN unless the targets are class indices) of `model` with its parameters and
    buffers replaced by `tensors`."""
    lossf = loss_for(loss_fn)
    loss = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.int64, device=x.device)
    classes = True
    for xb, yb in batches_of(x, y, chunk_size):
        output = call(model, xb, yb if lossf.from_model else None, tensors)
        logits = logits_of(output)
        loss += lossf(output, yb).double() * len(xb)
        classes = classes and class_indices(logits, yb)
        if classes:
            correct += (logits.argmax(-1) == yb).sum()
    return loss.item() / len(x), correct.item() / y.numel() if classes else float("nan")


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {**parameters_of(model), **buffers_of(model)}


def interpolate(model_a: nn.Module, model_b: nn.Module, data: Dataset, alphas: Sequence[float] = DEFAULT_ALPHAS,
                splits: Sequence[str] = SPLITS, chunk_size: int = DEFAULT_CHUNK,
                loss_fn: LossFn = F.cross_entropy) -> pd.DataFrame:
    """Loss and accuracy of theta(alpha) = (1 - alpha) theta_a + alpha theta_b along `alphas`.

    alpha 0 is model_a, 1 is model_b (Keskar et al.: a = small-batch, b = large-batch solution).
    BatchNorm buffers are interpolated too; running variances are clamped at 0 where extrapolation
    would make them negative, and integer buffers (num_batches_tracked) are taken from model_a.
    Returns columns alpha, split, loss, accuracy.
    """
    import pandas as pd  # not at the top: it would add ~0.4 s to every run's start
    state_a, state_b = _state(model_a), _state(model_b)
    if {k: v.shape for k, v in state_a.items()} != {k: v.shape for k, v in state_b.items()}:
        raise ConfigError("interpolate needs two models of the same architecture (parameter names and shapes differ)")
    rows = []
    with measuring(model_a, "eval"), measuring(model_b, "eval"):
        for alpha in alphas:
            tensors = {}
            for name, a in state_a.items():
                if not a.is_floating_point():
                    tensors[name] = a
                    continue
                mixed = (1 - alpha) * a + alpha * state_b[name]
                tensors[name] = mixed.clamp_min(0) if name.endswith("running_var") else mixed
            for split in splits:
                loss, accuracy = _loss_and_accuracy(model_a, tensors, *_split(data, split), chunk_size, loss_fn)
                rows.append({"alpha": float(alpha), "split": split, "loss": loss, "accuracy": accuracy})
    table = pd.DataFrame(rows, columns=["alpha", "split", "loss", "accuracy"])
    table.attrs["bn_mode"] = "eval"
    return table


# ----------------------------------------------------------------------------- directions
def filter_normalized_direction(model: nn.Module, generator: torch.Generator | None = None,
                                include_1d: bool = False) -> dict[str, torch.Tensor]:
    """A Gaussian direction with each filter rescaled to the norm of the matching filter of the weights
    (Li et al. 2018). A filter is a slice along dim 0 (an output channel or a row of a Linear weight).
    1-D parameters (biases, BatchNorm) get a zero direction unless include_1d, which normalises each as
    one filter."""
    generator = generator_or_default(generator)
    out = {}
    for name, p in parameters_of(model).items():
        d = normal_like(p, generator)
        if p.dim() <= 1:
            d = d * (p.norm() / d.norm().clamp_min(1e-12)) if include_1d else torch.zeros_like(p)
        else:
            dims = tuple(range(1, p.dim()))
            d = d * (p.norm(dim=dims, keepdim=True) / d.norm(dim=dims, keepdim=True).clamp_min(1e-12))
        out[name] = d
    return out


def hessian_directions(model: nn.Module, batches: Batches, k: int = 2, generator: torch.Generator | None = None,
                       tol: float = 1e-3, loss_fn: LossFn = F.cross_entropy) -> list[dict[str, torch.Tensor]]:
    """The top-k Hessian eigenvectors (Lanczos, eval-mode BatchNorm) as unit-norm directions."""
    pairs = top_eigenvalues(model, batches, k=k, tol=tol, generator=generator, loss_fn=loss_fn)
    like = parameters_of(model)
    return [{n: t.clone() for n, t in unflatten(v, like).items()} for v in pairs.eigenvectors]


def _flat(direction: Direction, like: dict[str, torch.Tensor]) -> torch.Tensor:
    flat = direction if isinstance(direction, torch.Tensor) else flatten([direction[n] for n in like])
    if flat.numel() != sum(t.numel() for t in like.values()):
        raise ConfigError("a direction must have one entry per model parameter")
    return flat.to(next(iter(like.values())))


# ----------------------------------------------------------------------------- slices
def slice_2d(model: nn.Module, data: Dataset, direction_x: Direction, direction_y: Direction | None,
             alphas: Sequence[float], betas: Sequence[float] = (0.0,), splits: Sequence[str] = ("train",),
             chunk_size: int = DEFAULT_CHUNK, loss_fn: LossFn = F.cross_entropy) -> pd.DataFrame:
    """Loss and accuracy at theta + alpha d_x + beta d_y on the grid alphas x betas (buffers unchanged).

    Returns columns alpha, beta, split, loss, accuracy.
    """
    import pandas as pd  # not at the top: it would add ~0.4 s to every run's start
    rows = []
    with measuring(model, "eval"):
        like = parameters_of(model)
        buffers = buffers_of(model)
        theta = flatten(like)
        dx = _flat(direction_x, like)
        dy = _flat(direction_y, like) if direction_y is not None else torch.zeros_like(theta)
        for alpha in alphas:
            for beta in betas:
                params = unflatten(theta + alpha * dx + beta * dy, like)
                for split in splits:
                    loss, accuracy = _loss_and_accuracy(model, {**params, **buffers}, *_split(data, split),
                                                        chunk_size, loss_fn)
                    rows.append({"alpha": float(alpha), "beta": float(beta), "split": split, "loss": loss,
                                 "accuracy": accuracy})
    table = pd.DataFrame(rows, columns=["alpha", "beta", "split", "loss", "accuracy"])
    table.attrs["bn_mode"] = "eval"
    return table


SLICE_ALPHAS = tuple(float(a) for a in np.linspace(-1.0, 1.0, 21))  # a 1-D slice's default: [-1, 1] in steps of 0.1


def slice_1d(model: nn.Module, data: Dataset, direction: Direction,
             alphas: Sequence[float] = SLICE_ALPHAS,
             splits: Sequence[str] = ("train",), chunk_size: int = DEFAULT_CHUNK,
             loss_fn: LossFn = F.cross_entropy) -> pd.DataFrame:
    """Loss and accuracy at theta + alpha d (columns alpha, split, loss, accuracy)."""
    table = slice_2d(model, data, direction, None, alphas, (0.0,), splits, chunk_size, loss_fn)
    return table.drop(columns="beta")
