"""The two-batch estimator of the gradient noise scale (McCandlish et al. 2018, appendix A.1) and its moving
average: plain numbers in, plain numbers out (torch only for squared_grad_norm), nothing of a training loop.

Scaling: a squared norm here is |G_B|^2, the squared norm of the gradient of a loss that is the MEAN over a
batch of B units (examples, or tokens for a token-level loss). E|G_B|^2 = |G|^2 + tr(Sigma) / B, which two batch
sizes at the same weights solve for |G|^2 and tr(Sigma) (per unit); B_simple = tr(Sigma) / |G|^2 is in units.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn


def two_batch_estimate(sq_norm_small: float, sq_norm_big: float, b_small: float, b_big: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) from |G_small|^2 and |G_big|^2 (McCandlish et al., appendix A.1).

    Unbiased when each squared norm is unbiased for |G|^2 + tr(Sigma)/B, e.g. batches drawn with
    replacement; average these over draws, then take the ratio (never average ratios).
    """
    grad_sq = (b_big * sq_norm_big - b_small * sq_norm_small) / (b_big - b_small)
    trace_cov = (sq_norm_small - sq_norm_big) / (1 / b_small - 1 / b_big)
    return grad_sq, trace_cov


def micro_batch_estimate(sq_norms_small: Sequence[float], b_smalls: Sequence[float], sq_norm_big: float,
                         b_big: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)): the mean over the small batches of two_batch_estimate, each against the same big batch.

    For the micro-batches of one accumulated step (or the devices' shares of one global batch): small batch i
    has b_smalls[i] units and squared norm sq_norms_small[i], the big batch (their union) b_big and sq_norm_big.
    The pairs share the big batch, so they are not independent, but each is unbiased and so is their mean;
    sizes may differ (token counts). With one small batch it is two_batch_estimate, bit for bit.
    """
    if len(sq_norms_small) != len(b_smalls) or not sq_norms_small:
        raise ValueError(f"need one size per small batch, at least one; got {len(sq_norms_small)} squared norms "
                         f"and {len(b_smalls)} sizes")
    pairs = [two_batch_estimate(s, sq_norm_big, b, b_big) for s, b in zip(sq_norms_small, b_smalls)]
    return sum(g for g, _ in pairs) / len(pairs), sum(t for _, t in pairs) / len(pairs)


def ratio(trace_cov: float, grad_sq_norm: float) -> float:
    """B_simple = tr(Sigma) / |G|^2 (inf where the |G|^2 estimate is <= 0, NaN where either is NaN)."""
    if math.isnan(trace_cov) or math.isnan(grad_sq_norm):
        return math.nan
    return trace_cov / grad_sq_norm if grad_sq_norm > 0 else math.inf


@dataclass(frozen=True)
class NoiseScaleEMA:
    """Exponential moving averages of the two-batch |G|^2 and tr(Sigma) estimates, ratio taken after averaging
    (never an average of ratios). Bias-corrected like Adam. Its fields are what a checkpoint keeps."""
    decay: float
    n_samples: int = 0
    grad_sq_norm_avg: float = 0.0      # uncorrected accumulators
    trace_cov_avg: float = 0.0

    def _corrected(self, value: float) -> float:
        return value / (1 - self.decay ** self.n_samples) if self.n_samples else math.nan

    @property
    def grad_sq_norm(self) -> float:
        return self._corrected(self.grad_sq_norm_avg)

    @property
    def trace_cov(self) -> float:
        return self._corrected(self.trace_cov_avg)

    @property
    def b_simple(self) -> float:
        if not self.n_samples:
            return math.nan
        return self.trace_cov / self.grad_sq_norm if self.grad_sq_norm > 0 else math.inf


def update_noise_ema(ema: NoiseScaleEMA, sq_norm_small: float, sq_norm_big: float, b_small: float,
                     b_big: float) -> NoiseScaleEMA:
    """The EMA after one more pair of squared gradient norms (non-finite pairs are skipped)."""
    if not (math.isfinite(sq_norm_small) and math.isfinite(sq_norm_big)):
        return ema
    return add_to_ema(ema, *two_batch_estimate(sq_norm_small, sq_norm_big, b_small, b_big))


def add_to_ema(ema: NoiseScaleEMA, grad_sq_norm: float, trace_cov: float) -> NoiseScaleEMA:
    """The EMA after one more (|G|^2, tr(Sigma)) estimate (a non-finite one is skipped)."""
    if not (math.isfinite(grad_sq_norm) and math.isfinite(trace_cov)):
        return ema
    d = ema.decay
    return dataclasses.replace(ema, n_samples=ema.n_samples + 1,
                               grad_sq_norm_avg=d * ema.grad_sq_norm_avg + (1 - d) * grad_sq_norm,
                               trace_cov_avg=d * ema.trace_cov_avg + (1 - d) * trace_cov)


def noise_ema_columns(ema: NoiseScaleEMA | None) -> dict[str, float]:
    """A training history's columns of the EMA (NaN before the first sample)."""
    ema = ema or NoiseScaleEMA(decay=0.0)
    return {"noise_b_simple_ema": ema.b_simple, "noise_grad_sq_norm_ema": ema.grad_sq_norm,
            "noise_trace_cov_ema": ema.trace_cov}


def squared_grad_norm(model: nn.Module) -> torch.Tensor:
    """|p.grad|^2 summed over the model's parameters (a 0-d float32 tensor; no device sync)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for p in model.parameters():
        if p.grad is not None:
            total += (p.grad.float() ** 2).sum()
    return total
