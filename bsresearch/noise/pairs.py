"""The two-batch estimator on a trained model (no training loop): |G_small|^2 and |G_big|^2 of batch pairs drawn
from a data set at the model's weights, their B_simple (a ratio of averages) and its bootstrap interval over the
pairs; and small_batch_sq_norm, one batch's squared gradient norm measured beside a training loop without
touching it (NoiseScaleTracker's small batch). Scaling as in estimators.py: mean-loss gradients, sizes in examples.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..measure.functional import LossFn, MeanLoss, generator_or_default, measuring
from .estimators import two_batch_estimate

if TYPE_CHECKING:
    import pandas as pd


def small_batch_sq_norm(model: nn.Module, loss_fn: Callable[[Any, Any], torch.Tensor], x: Any, y: Any) -> float:
    """|grad of loss_fn(x, y)|^2 over the model's trainable parameters (float32 sums), at its weights now.

    Leaves the training loop exactly as it was: torch.autograd.grad writes no .grad (the optimizer later sees
    the gradient it would see without this call), the model's buffers (BatchNorm running statistics) are put
    back, and the forward pass runs inside torch.random.fork_rng (dropout masks drawn for it do not shift the
    loop's random stream). loss_fn(x, y) runs the model and returns the mean loss of those examples.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = [b.detach().clone() for b in model.buffers()]
    devices = [p.device for p in params if p.device.type == "cuda"][:1]
    with torch.random.fork_rng(devices=devices):
        loss = loss_fn(x, y)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)
    return float(sum((g.float() ** 2).sum() for g in grads if g is not None))


@dataclass(frozen=True)
class TwoBatchNoiseScale:
    """B_simple from gradient norms at two batch sizes, averaged over draws before the ratio."""
    b_simple: float             # trace_cov / grad_sq_norm (inf when grad_sq_norm <= 0)
    grad_sq_norm: float         # mean over draws of the |G|^2 estimate
    trace_cov: float            # mean over draws of the tr(Sigma) estimate
    b_small: int
    b_big: int
    n_draws: int
    sq_norm_small: float        # mean |G_small|^2 over draws
    sq_norm_big: float          # mean |G_big|^2
    replacement: bool
    bn_mode: str


def two_batch_noise_scale(model: nn.Module, x: torch.Tensor, y: torch.Tensor, b_small: int, b_big: int,
                          n_draws: int = 20, generator: torch.Generator | None = None, replacement: bool = True,
                          loss_fn: LossFn = F.cross_entropy, bn_mode: str = "eval") -> TwoBatchNoiseScale:
    """The two-batch estimator on `n_draws` random batches of b_big examples from (x, y); the small
    batch is the first b_small of each big one (both gradients at the same parameters).

    replacement=True draws examples i.i.d., which makes both estimates unbiased for the data set's
    Sigma with 1/N normalisation; without replacement |G|^2 is low by tr(Sigma)/N.
    """
    n = len(x)
    if not 1 <= b_small < b_big:
        raise ValueError(f"need 1 <= b_small < b_big; got b_small={b_small}, b_big={b_big}")
    if not replacement and b_big > n:
        raise ValueError(f"b_big {b_big} exceeds the {n} examples (sampling without replacement)")
    generator = generator_or_default(generator)
    small, big = [], []
    with measuring(model, bn_mode):
        for _ in range(n_draws):
            if replacement:
                idx = torch.randint(n, (b_big,), generator=generator, device=generator.device)
            else:
                idx = torch.randperm(n, generator=generator, device=generator.device)[:b_big]
            idx = idx.to(x.device)
            g_small = MeanLoss(model, [(x[idx[:b_small]], y[idx[:b_small]])], loss_fn).value_and_grad()[1]
            g_big = MeanLoss(model, [(x[idx], y[idx])], loss_fn).value_and_grad()[1]
            small.append(float(g_small @ g_small))
            big.append(float(g_big @ g_big))
    sq_small, sq_big = float(np.mean(small)), float(np.mean(big))
    grad_sq, trace = two_batch_estimate(sq_small, sq_big, b_small, b_big)
    return TwoBatchNoiseScale(trace / grad_sq if grad_sq > 0 else math.inf, grad_sq, trace, b_small, b_big,
                              n_draws, sq_small, sq_big, replacement, bn_mode)


def two_batch_pairs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, b_small: int, b_big: int, n_pairs: int,
                    generator: torch.Generator | None = None, loss_fn: LossFn = F.cross_entropy) -> pd.DataFrame:
    """|G_small|^2 and |G_big|^2 of `n_pairs` independent batch pairs at the model's weights, drawn as
    two_batch_noise_scale draws them (b_big examples with replacement, the small batch the first
    b_small of them; eval-mode BatchNorm), with each pair's two-batch |G|^2 and tr(Sigma)
    (estimators.two_batch_estimate). Columns: pair, sq_norm_small, sq_norm_big, grad_sq_norm, trace_cov."""
    import pandas as pd  # not at the top: it would add ~0.4 s to every run's start
    rows = []
    for i in range(n_pairs):
        one = two_batch_noise_scale(model, x, y, b_small, b_big, n_draws=1, generator=generator, loss_fn=loss_fn)
        grad_sq, trace = two_batch_estimate(one.sq_norm_small, one.sq_norm_big, b_small, b_big)
        rows.append({"pair": i, "sq_norm_small": one.sq_norm_small, "sq_norm_big": one.sq_norm_big,
                     "grad_sq_norm": grad_sq, "trace_cov": trace})
    return pd.DataFrame(rows)


def two_batch_summary(pairs: pd.DataFrame, n_bootstrap: int = 2000, confidence: float = 0.95,
                      seed: int = 0) -> dict[str, float]:
    """The two-batch B_simple of `pairs` (two_batch_pairs) as the tracker forms it, mean tr(Sigma) / mean |G|^2
    (a ratio of averages), with a percentile bootstrap interval over the pairs (`n_bootstrap` resamples, NumPy
    generator seeded `seed`; a resample whose mean |G|^2 <= 0 gives inf; the ends are order statistics).
    Keys: b_simple, low, high, n_pairs, grad_sq_norm, trace_cov, frac_pairs_negative (pairs whose own |G|^2
    estimate is <= 0)."""
    g2 = pairs["grad_sq_norm"].to_numpy(float)
    tr = pairs["trace_cov"].to_numpy(float)

    def ratio(t: np.ndarray, g: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(g > 0, t / g, np.inf)

    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pairs), size=(n_bootstrap, len(pairs)))
    boot = ratio(tr[idx].mean(axis=1), g2[idx].mean(axis=1))
    alpha = (1 - confidence) / 2
    low, high = np.quantile(boot, [alpha, 1 - alpha], method="inverted_cdf")  # an order statistic: inf stays inf
    return {"b_simple": float(ratio(np.array(tr.mean()), np.array(g2.mean()))), "low": float(low),
            "high": float(high), "n_pairs": len(pairs), "grad_sq_norm": float(g2.mean()),
            "trace_cov": float(tr.mean()), "frac_pairs_negative": float((g2 <= 0).mean())}
