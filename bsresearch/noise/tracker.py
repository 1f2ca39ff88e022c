"""NoiseScaleTracker: the two-batch noise scale in a user's own training loop, a face of NoiseMeter that also
measures the small batch itself (pairs.small_batch_sq_norm) when the loop gives it the batch and a loss closure.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .estimators import squared_grad_norm
from .meter import NoiseMeter
from .pairs import small_batch_sq_norm


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
    half the batch) with pairs.small_batch_sq_norm, so .grad is never written: the optimizer sees exactly the
    gradient it would see without the tracker. The extra forward pass runs with the model's buffers
    (BatchNorm running statistics) restored afterwards and inside torch.random.fork_rng (dropout masks
    drawn for it do not shift the loop's random stream). Both norms are at the same parameters, so the
    pair feeds the tracker's NoiseMeter (`meter`) as the training loop's micro-batches feed theirs.
    Call it before gradient clipping; with a GradScaler pass grad_scale=scaler.get_scale() (the .grad is
    scaled, the small-batch gradient is not). A loop that accumulates micro-batches itself can call
    `record(sq_norm_small, sq_norm_big, b_small, b_big)` with norms it measured.
    Cost: one forward and backward pass over small_batch_size examples every `every` calls.
    """

    def __init__(self, model: nn.Module, decay: float = 0.95, every: int = 1,
                 small_batch_size: int | None = None) -> None:
        if every < 1:
            raise ValueError(f"every must be a positive integer; got {every}")
        self.model = model
        self.every = every
        self.small_batch_size = small_batch_size
        self.meter = NoiseMeter(decay)   # checks decay
        self.calls = 0          # observe() calls so far (samples are taken on calls 0, every, 2 every, ...)
        self.history: list[dict[str, float]] = []   # one row per sample: b_simple (EMA) and the pair

    @property
    def b_simple(self) -> float:
        """The EMA estimate of B_simple = tr(Sigma) / |G|^2 in examples (NaN before the first sample)."""
        return self.meter.b_simple

    def record(self, sq_norm_small: float, sq_norm_big: float, b_small: int, b_big: int) -> float:
        """Feed one pair of squared gradient norms (mean-reduced losses, same parameters); returns B_simple."""
        sample = self.meter.pair(sq_norm_small, sq_norm_big, b_small, b_big, estimator="two_batch")
        self.history.append({"sample": len(self.history), "b_simple": sample.b_simple_ema,
                             "sq_norm_small": sq_norm_small, "sq_norm_big": sq_norm_big, "b_small": b_small,
                             "b_big": b_big})
        return sample.b_simple_ema

    def observe(self, loss_fn: Callable[[Any, Any], torch.Tensor], x: Any, y: Any,
                grad_scale: float = 1.0) -> float:
        """After loss.backward() on (x, y): sample the noise scale every `every` calls; returns B_simple.

        loss_fn(x_part, y_part) runs the model and returns the mean loss of those examples (a closure over
        the model). x and y are indexed along their first dimension; len(x) is the big batch.
        """
        call, self.calls = self.calls, self.calls + 1
        if call % self.every:
            return self.meter.b_simple
        b_big = len(x)
        b_small = self.small_batch_size or b_big // 2
        if not 1 <= b_small < b_big:
            raise ValueError(f"need 1 <= small_batch_size < batch size; got {b_small} and {b_big}")
        if any(p.grad is None for p in self.model.parameters() if p.requires_grad):
            raise ValueError("observe() reads the batch gradient from .grad: call it after loss.backward()")
        sq_big = float(squared_grad_norm(self.model)) / grad_scale ** 2
        sq_small = small_batch_sq_norm(self.model, loss_fn, x[:b_small], y[:b_small])
        return self.record(sq_small, sq_big, b_small, b_big)
