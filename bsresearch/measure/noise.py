"""Gradient noise scale (McCandlish et al. 2018): exact per-example statistics, the two-batch estimator
(its formula and the training loop's EMA live in bsresearch.noise_tracker), a bootstrap interval, and
B_noise with the Hessian.

Scaling, everywhere: the loss is the mean cross-entropy over a batch (any mean-reduced loss_fn works);
g_i is the gradient of example i's loss, G the mean of g_i over the data, Sigma the covariance of
the g_i (1/(N-1) normalisation). Then a batch of B examples has gradient noise covariance Sigma/B and
B_simple = tr(Sigma)/|G|^2 is in examples. Per-example gradients need BatchNorm in eval mode (a single
example has no batch statistics), so every per-example quantity here uses eval mode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import grad, vmap

from ..losses import loss_for
from ..noise_tracker import two_batch_estimate  # re-exported: the formula lives with the EMA
from .critical import CriticalBatchFit, fit_critical_batch, fit_critical_batch_examples  # noqa: F401 (re-export)
from .functional import (
    ATTENTION_KERNEL,
    LossFn,
    MeanLoss,
    batches_of,
    buffers_of,
    generator_or_default,
    layer_slices,
    measuring,
    parameters_of,
    rademacher_like,
    unflatten,
)

if TYPE_CHECKING:
    import pandas as pd


# ----------------------------------------------------------------------------- exact, per example
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


# ----------------------------------------------------------------------------- two batch sizes
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


# ----------------------------------------------------------------------------- two-batch draws and their interval
def two_batch_pairs(model: nn.Module, x: torch.Tensor, y: torch.Tensor, b_small: int, b_big: int, n_pairs: int,
                    generator: torch.Generator | None = None, loss_fn: LossFn = F.cross_entropy) -> pd.DataFrame:
    """|G_small|^2 and |G_big|^2 of `n_pairs` independent batch pairs at the model's weights, drawn as
    measure.noise.two_batch_noise_scale draws them (b_big examples with replacement, the small batch the first
    b_small of them; eval-mode BatchNorm), with each pair's two-batch |G|^2 and tr(Sigma)
    (noise_tracker.two_batch_estimate). Columns: pair, sq_norm_small, sq_norm_big, grad_sq_norm, trace_cov."""
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


# ----------------------------------------------------------------------------- B_noise, with the Hessian
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
