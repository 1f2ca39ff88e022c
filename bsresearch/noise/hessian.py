"""B_noise = tr(H Sigma) / (G^T H G) (McCandlish et al. 2018): the noise scale that weighs the gradient noise by
the curvature, from Hessian-vector products and Hutchinson probes over the examples, without per-example
gradients. Scaling as in exact.py; eval-mode BatchNorm; (x, y) taken as the population.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import vmap

from ..measure.functional import (
    ATTENTION_KERNEL,
    LossFn,
    MeanLoss,
    batches_of,
    generator_or_default,
    measuring,
    rademacher_like,
    unflatten,
)


@dataclass(frozen=True)
class HessianNoiseScale:
    """B_noise = tr(H Sigma) / (G^T H G) (McCandlish et al.), eval-mode BatchNorm, (x, y) as the population."""
    b_noise: float
    b_noise_std_error: float    # from the Hutchinson error of tr(H Sigma)
    trace_h_sigma: float        # Hutchinson estimate over examples
    trace_h_sigma_std_error: float
    g_h_g: float                # G^T H G, exact
    n_examples: int
    n_probes: int
    n_products: int             # Hessian-vector products used
    bn_mode: str = "eval"
    attention: str = ATTENTION_KERNEL  # the attention kernel of its Hessian-vector products


def hessian_noise_scale(model: nn.Module, x: torch.Tensor, y: torch.Tensor, n_probes: int = 10,
                        chunk_size: int = 1024, generator: torch.Generator | None = None,
                        loss_fn: LossFn = F.cross_entropy) -> HessianNoiseScale:
    """B_noise by Hessian-vector products, without per-example gradients.

    tr(H Sigma) = sum_i d_i^T H d_i / (N-1) with d_i = g_i - G. For Rademacher signs z over the
    examples, u = sum_i z_i d_i = grad(sum_i z_i loss_i) - (sum_i z_i) G has E[u^T H u] = sum_i d_i^T H d_i,
    so each probe costs one weighted backward pass and one Hessian-vector product.
    """
    n = len(x)
    if n < 2 or n_probes < 2:
        raise ValueError(f"need at least 2 examples and 2 probes; got {n} and {n_probes}")
    generator = generator_or_default(generator)
    with measuring(model, "eval"):
        loss = MeanLoss(model, batches_of(x, y, chunk_size), loss_fn)
        mean_grad = loss.value_and_grad()[1]
        g_h_g = float(mean_grad @ loss.hvp(mean_grad))
        samples = []
        for _ in range(n_probes):
            signs = rademacher_like(loss.point, generator, (n,))
            u = _signed_example_gradient(loss, signs, loss_fn) - signs.sum() * mean_grad
            samples.append(float(u @ loss.hvp(u)) / (n - 1))
    values = np.array(samples)
    trace, trace_se = float(values.mean()), float(values.std(ddof=1) / math.sqrt(n_probes))
    return HessianNoiseScale(trace / g_h_g, trace_se / abs(g_h_g), trace, trace_se, g_h_g, n, n_probes,
                             loss.n_products)


def _signed_example_gradient(loss: MeanLoss, signs: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
    """grad of sum_i signs_i * loss_i over all examples of loss.batches (in order), flat."""
    if loss.loss_fn.from_model:
        raise ValueError("B_noise needs each example's loss, and `loss: model` gives one loss per batch")
    flat = loss.point.detach().requires_grad_(True)
    out = torch.zeros_like(flat)
    start = 0
    for x, y in loss.batches:
        logits = loss.logits(unflatten(flat, loss.like), x)
        example_losses = vmap(lambda o, t: loss_fn(o.unsqueeze(0), t.unsqueeze(0)))(logits, y)
        weighted = (signs[start:start + len(x)] * example_losses).sum()
        out += torch.autograd.grad(weighted, flat)[0]
        start += len(x)
    return out
