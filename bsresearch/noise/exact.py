"""The exact gradient noise scale of a data set from its per-example gradients (torch.func.vmap over grad):
B_simple = tr(Sigma) / |G|^2 with a bootstrap interval and per layer, as NoiseScale (the one class of that name).

Scaling, everywhere in this package: the loss is the mean over a batch (cross-entropy by default; any
mean-reduced loss_fn works); g_i is the gradient of example i's loss, G the mean of g_i over the data, Sigma the
covariance of the g_i (1/(N-1) normalisation). Then a batch of B examples has gradient noise covariance Sigma/B
and B_simple is in examples. Per-example gradients need BatchNorm in eval mode (a single example has no batch
statistics), so every per-example quantity here uses eval mode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import grad, vmap

from ..losses import loss_for
from ..measure.functional import (
    LossFn,
    buffers_of,
    generator_or_default,
    layer_slices,
    measuring,
    parameters_of,
)


def _per_example_flat(model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                      x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
    """(len(x), n_parameters) per-example gradients by vmap over grad (model already in eval mode)."""
    of = loss_for(loss_fn).of

    def example_loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return of(model, xi.unsqueeze(0), yi.unsqueeze(0), {**p, **buffers})
    grads = vmap(grad(example_loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g.reshape(len(x), -1) for g in grads.values()], dim=1)


def per_example_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                          loss_fn: LossFn = F.cross_entropy) -> torch.Tensor:
    """Per-example gradients, shape (N, n_parameters), flat in model.parameters() order, eval mode.

    Holds all N x n_parameters numbers: for statistics over many examples use gradient_noise_scale,
    which processes them in chunks.
    """
    with measuring(model, "eval"):
        buffers = buffers_of(model)
        return _per_example_flat(model, parameters_of(model), buffers, x, y, loss_fn)


@dataclass(frozen=True)
class NoiseScale:
    """Exact gradient noise statistics over a data set (eval-mode BatchNorm)."""
    b_simple: float             # tr(Sigma) / |G|^2, in examples (inf when the |G|^2 estimate is <= 0)
    trace_cov: float            # tr(Sigma): per-example gradient variance summed over parameters, 1/(N-1)
    grad_sq_norm: float         # |G|^2 used in b_simple: |mean g_i|^2, minus tr(Sigma)/N when unbiased
    n_examples: int
    mean_grad_sq_norm: float    # |mean g_i|^2 without correction
    unbiased: bool              # True: the data is a sample of a larger set and |G|^2 is corrected
    b_simple_interval: tuple[float, float] | None = None  # bootstrap percentile interval, if asked for
    confidence: float | None = None
    n_bootstrap: int = 0
    per_layer: dict[str, NoiseScale] | None = None       # the same per module ('0' = '0.weight' + '0.bias')
    bn_mode: str = "eval"


def _noise_from_sums(sum_grad_sq: float, sum_sq_norms: float, n: int,
                     unbiased: bool) -> tuple[float, float, float, float]:
    """(b_simple, trace_cov, grad_sq_norm, mean_grad_sq_norm) from |sum g_i|^2 and sum |g_i|^2."""
    mean_sq = sum_grad_sq / n ** 2
    trace_cov = (sum_sq_norms - n * mean_sq) / (n - 1)
    grad_sq = mean_sq - trace_cov / n if unbiased else mean_sq
    b_simple = trace_cov / grad_sq if grad_sq > 0 else math.inf
    return b_simple, trace_cov, grad_sq, mean_sq


def _bootstrap_counts(n: int, n_bootstrap: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """(n_bootstrap, n) multiplicities of each example in resamples of size n drawn with replacement."""
    idx = torch.randint(n, (n_bootstrap, n), generator=generator, device=generator.device)
    ones = torch.ones_like(idx, dtype=torch.float32)
    counts = torch.zeros(n_bootstrap, n, device=generator.device).scatter_add_(1, idx, ones)
    return counts.to(device)


def gradient_noise_scale(model: nn.Module, x: torch.Tensor, y: torch.Tensor, chunk_size: int = 256,
                         per_layer: bool = False, unbiased: bool = True, n_bootstrap: int = 0,
                         confidence: float = 0.95, generator: torch.Generator | None = None,
                         loss_fn: LossFn = F.cross_entropy) -> NoiseScale:
    """Exact B_simple = tr(Sigma)/|G|^2 from the per-example gradients of all N examples of (x, y).

    Per-example gradients come from torch.func (vmap over grad), chunk_size examples at a time, so
    memory is chunk_size x n_parameters; sums are accumulated in float64.
    unbiased=True treats (x, y) as a sample of a larger set: |G|^2 = |mean g_i|^2 - tr(Sigma)/N is
    unbiased for the larger set's |G|^2. unbiased=False treats (x, y) as the whole population (e.g.
    the training set SGD samples from): |G|^2 = |mean g_i|^2 exactly.
    n_bootstrap > 0 adds a percentile interval for B_simple from that many resamples of the examples,
    each put through the same estimator (extra memory n_bootstrap x n_parameters, draws from
    `generator`). It describes sampling variability, so it belongs with unbiased=True on a sample; it is
    trustworthy when B_simple << N (when |G|^2 is not much above tr(Sigma)/N, |mean g_i|^2 is mostly
    noise and the resampled B_simple is biased low).
    """
    n = len(x)
    if n < 2:
        raise ValueError(f"need at least 2 examples for a covariance; got {n}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer; got {chunk_size}")
    generator = generator_or_default(generator)
    with measuring(model, "eval"):
        params = parameters_of(model)
        buffers = buffers_of(model)
        slices = layer_slices(model)
        device = x.device
        n_params = sum(p.numel() for p in params.values())
        sum_grad = torch.zeros(n_params, dtype=torch.float64, device=device)
        sq_norms = torch.zeros(n, len(slices), dtype=torch.float64, device=device)  # per example, per layer
        counts = _bootstrap_counts(n, n_bootstrap, generator, device) if n_bootstrap else None
        boot_sums = torch.zeros(n_bootstrap, n_params, dtype=torch.float64, device=device) if n_bootstrap else None
        for start in range(0, n, chunk_size):
            g = _per_example_flat(model, params, buffers, x[start:start + chunk_size], y[start:start + chunk_size],
                                  loss_fn)
            g64 = g.double()
            sum_grad += g64.sum(0)
            sq_norms[start:start + len(g)] = torch.stack([(g64[:, part] ** 2).sum(1) for part in slices.values()], 1)
            if counts is not None and boot_sums is not None:
                boot_sums += counts[:, start:start + len(g)].to(g.dtype) @ g
    b, trace, grad_sq, mean_sq = _noise_from_sums(float(sum_grad @ sum_grad), float(sq_norms.sum()), n, unbiased)
    interval = None
    if counts is not None and boot_sums is not None:
        totals = counts.double() @ sq_norms.sum(1)
        replicates = np.array([_noise_from_sums(float(s @ s), float(t), n, unbiased)[0]
                               for s, t in zip(boot_sums, totals)])
        low, high = np.quantile(replicates, [(1 - confidence) / 2, (1 + confidence) / 2])
        interval = (float(low), float(high))
    layers: dict[str, NoiseScale] | None = None
    if per_layer:
        layers = {}
        for column, (layer, part) in enumerate(slices.items()):
            s = sum_grad[part]
            lb, lt, lg, lm = _noise_from_sums(float(s @ s), float(sq_norms[:, column].sum()), n, unbiased)
            layers[layer] = NoiseScale(lb, lt, lg, n, lm, unbiased)
    return NoiseScale(b, trace, grad_sq, n, mean_sq, unbiased, interval, confidence if interval else None,
                      n_bootstrap, layers)
