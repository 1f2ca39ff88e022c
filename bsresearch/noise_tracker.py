"""The in-loop gradient noise scale: the two-batch estimator (McCandlish et al. 2018, appendix A.1) and
the exponential moving average that a training loop feeds from the micro-batches of a step.

torch only, no measurement code: train.py and a user's own loop both use it. The exact per-example
statistics and the offline two-batch measurement are in bsresearch.measure.noise.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn


def two_batch_estimate(sq_norm_small: float, sq_norm_big: float, b_small: int, b_big: int) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) from |G_small|^2 and |G_big|^2 (McCandlish et al., appendix A.1).

    Unbiased when each squared norm is unbiased for |G|^2 + tr(Sigma)/B, e.g. batches drawn with
    replacement; average these over draws, then take the ratio (never average ratios).
    """
    grad_sq = (b_big * sq_norm_big - b_small * sq_norm_small) / (b_big - b_small)
    trace_cov = (sq_norm_small - sq_norm_big) / (1 / b_small - 1 / b_big)
    return grad_sq, trace_cov


@dataclass(frozen=True)
class NoiseScaleEMA:
    """Exponential moving averages of the two-batch |G|^2 and tr(Sigma) estimates, fed by the training
    loop from the micro-batches of a step; ratio taken after averaging. Bias-corrected like Adam."""
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


def update_noise_ema(ema: NoiseScaleEMA, sq_norm_small: float, sq_norm_big: float, b_small: int,
                     b_big: int) -> NoiseScaleEMA:
    """The EMA after one more pair of squared gradient norms (non-finite pairs are skipped)."""
    if not (math.isfinite(sq_norm_small) and math.isfinite(sq_norm_big)):
        return ema
    grad_sq, trace = two_batch_estimate(sq_norm_small, sq_norm_big, b_small, b_big)
    d = ema.decay
    return dataclasses.replace(ema, n_samples=ema.n_samples + 1,
                               grad_sq_norm_avg=d * ema.grad_sq_norm_avg + (1 - d) * grad_sq,
                               trace_cov_avg=d * ema.trace_cov_avg + (1 - d) * trace)


def squared_grad_norm(model: nn.Module) -> torch.Tensor:
    """|p.grad|^2 summed over the model's parameters (a 0-d float32 tensor; no device sync)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for p in model.parameters():
        if p.grad is not None:
            total += (p.grad.float() ** 2).sum()
    return total


def noise_ema_columns(ema: NoiseScaleEMA | None) -> dict[str, float]:
    """History columns for the training loop (NaN before the first sample)."""
    ema = ema or NoiseScaleEMA(decay=0.0)
    return {"noise_b_simple_ema": ema.b_simple, "noise_grad_sq_norm_ema": ema.grad_sq_norm,
            "noise_trace_cov_ema": ema.trace_cov}
