"""The in-loop gradient noise scale: the two-batch estimator (McCandlish et al. 2018, appendix A.1) and
the exponential moving average that a training loop feeds from the micro-batches of a step.

torch only, no measurement code: train.py and a user's own loop both use it. The exact per-example
statistics and the offline two-batch measurement are in bsresearch.measure.noise.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


class NoiseScaleTracker:
    """The two-batch noise scale for your own training loop, in a few lines and without a RunConfig.

        tracker = NoiseScaleTracker(model, decay=0.95, every=10)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            tracker.observe(lambda xs, ys: loss_fn(model(xs), ys), x, y)  # after backward, before step
            optimizer.step()
        print(tracker.b_simple)

    `observe` reads |G_big|^2 from the .grad the loop's backward left (the mean-reduced loss of the whole
    batch of len(x) examples) and computes |G_small|^2 of the first `small_batch_size` examples (default
    half the batch) with torch.autograd.grad, so .grad is never written: the optimizer sees exactly the
    gradient it would see without the tracker. The extra forward pass runs with the model's buffers
    (BatchNorm running statistics) restored afterwards and inside torch.random.fork_rng (dropout masks
    drawn for it do not shift the loop's random stream). Both norms are at the same parameters, so the
    pair feeds update_noise_ema exactly as train.py's micro-batches do.
    Call it before gradient clipping; with a GradScaler pass grad_scale=scaler.get_scale() (the .grad is
    scaled, the small-batch gradient is not). A loop that accumulates micro-batches itself can call
    `record(sq_norm_small, sq_norm_big, b_small, b_big)` with norms it measured.
    Cost: one forward and backward pass over small_batch_size examples every `every` calls.
    """

    def __init__(self, model: nn.Module, decay: float = 0.95, every: int = 1,
                 small_batch_size: int | None = None) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1); got {decay}")
        if every < 1:
            raise ValueError(f"every must be a positive integer; got {every}")
        self.model = model
        self.every = every
        self.small_batch_size = small_batch_size
        self.ema = NoiseScaleEMA(decay=decay)
        self.calls = 0          # observe() calls so far (samples are taken on calls 0, every, 2 every, ...)
        self.history: list[dict[str, float]] = []   # one row per sample: b_simple (EMA) and the pair

    @property
    def b_simple(self) -> float:
        """The EMA estimate of B_simple = tr(Sigma) / |G|^2 in examples (NaN before the first sample)."""
        return self.ema.b_simple

    def record(self, sq_norm_small: float, sq_norm_big: float, b_small: int, b_big: int) -> float:
        """Feed one pair of squared gradient norms (mean-reduced losses, same parameters); returns B_simple."""
        self.ema = update_noise_ema(self.ema, sq_norm_small, sq_norm_big, b_small, b_big)
        self.history.append({"sample": len(self.history), "b_simple": self.ema.b_simple, "sq_norm_small": sq_norm_small,
                             "sq_norm_big": sq_norm_big, "b_small": b_small, "b_big": b_big})
        return self.ema.b_simple

    def observe(self, loss_fn: Callable[[Any, Any], torch.Tensor], x: Any, y: Any,
                grad_scale: float = 1.0) -> float:
        """After loss.backward() on (x, y): sample the noise scale every `every` calls; returns B_simple.

        loss_fn(x_part, y_part) runs the model and returns the mean loss of those examples (a closure over
        the model). x and y are indexed along their first dimension; len(x) is the big batch.
        """
        call, self.calls = self.calls, self.calls + 1
        if call % self.every:
            return self.ema.b_simple
        b_big = len(x)
        b_small = self.small_batch_size or b_big // 2
        if not 1 <= b_small < b_big:
            raise ValueError(f"need 1 <= small_batch_size < batch size; got {b_small} and {b_big}")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if any(p.grad is None for p in params):
            raise ValueError("observe() reads the batch gradient from .grad: call it after loss.backward()")
        sq_big = float(squared_grad_norm(self.model)) / grad_scale ** 2
        buffers = [b.detach().clone() for b in self.model.buffers()]
        devices = [p.device for p in params if p.device.type == "cuda"][:1]
        with torch.random.fork_rng(devices=devices):
            small_loss = loss_fn(x[:b_small], y[:b_small])
            grads = torch.autograd.grad(small_loss, params, allow_unused=True)
        with torch.no_grad():
            for b, saved in zip(self.model.buffers(), buffers):
                b.copy_(saved)
        sq_small = float(sum((g.float() ** 2).sum() for g in grads if g is not None))
        return self.record(sq_small, sq_big, b_small, b_big)
