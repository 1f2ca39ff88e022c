"""NoiseMeter: the per-step gradient noise scale of any training loop, fed plain numbers (no model, no torch, no
bsresearch loop). The training loop's callbacks, NoiseScaleTracker and a framework's own callback all feed one.

A step gives one pair of batch sizes at the same weights, from whichever of three sources it has:

    micro_batches(sq_norms, sizes, sq_norm_big, b_big)   gradient accumulation: each micro-batch's own
                                                          mean-loss gradient and the accumulated batch's
    devices(local_sq_norm, reduced_sq_norm, b_local, b_global)
                                                          data parallel: a device's gradient before the
                                                          all-reduce (or the mean over devices of theirs)
                                                          and the averaged gradient after it
    pair(sq_norm_small, sq_norm_big, b_small, b_big)     any two batch sizes at the same weights (the
                                                          two-batch estimator on a batch and part of it)

and each returns the step's NoiseSample (this step's B_simple, the EMA after it, which estimator). Squared norms
are of MEAN-loss gradients over their batch (undo any loss scaling, accumulation division or GradScaler scale
before), sizes in the units the loss averages over (examples, or real tokens). See estimators.py.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .estimators import NoiseScaleEMA, add_to_ema, micro_batch_estimate, ratio

ESTIMATORS = ("micro_batch", "devices", "two_batch")   # a NoiseSample's `estimator`: where its pair came from


@dataclass(frozen=True)
class NoiseSample:
    """One step's estimate: this step's pair alone (b_simple: noisy, often inf where its |G|^2 estimate is
    <= 0) and the meter's moving average after it (b_simple_ema: the number to read)."""
    estimator: str            # one of ESTIMATORS
    b_small: float            # units (examples or tokens) of the small batch (the mean size over micro-batches)
    b_big: float              # units of the big batch
    grad_sq_norm: float       # this step's |G|^2 estimate (NaN for a non-finite pair, which the EMA skips)
    trace_cov: float          # this step's tr(Sigma) estimate, per unit
    b_simple: float           # trace_cov / grad_sq_norm (inf where grad_sq_norm <= 0)
    b_simple_ema: float       # the EMA's B_simple after this step (NaN before its first finite sample)
    step: int | None = None   # the caller's step number, when it gave one

    def row(self) -> dict[str, Any]:
        """The sample as a history row: step, b_simple, b_simple_ema, estimator, grad_sq_norm, trace_cov,
        b_small, b_big."""
        return {"step": self.step, "b_simple": self.b_simple, "b_simple_ema": self.b_simple_ema,
                "estimator": self.estimator, "grad_sq_norm": self.grad_sq_norm, "trace_cov": self.trace_cov,
                "b_small": self.b_small, "b_big": self.b_big}


class NoiseMeter:
    """The gradient noise scale along training: an EMA of decay `decay` (NoiseScaleEMA) over the pairs a
    training loop feeds it, one per step at most. `last` is the latest sample; `ema` its state, which
    state_dict / load_state_dict give to a checkpoint and take back."""

    def __init__(self, decay: float = 0.95) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1); got {decay}")
        self.ema = NoiseScaleEMA(decay=decay)
        self.last: NoiseSample | None = None

    @property
    def b_simple(self) -> float:
        """The EMA's B_simple = tr(Sigma) / |G|^2 in units (NaN before the first sample)."""
        return self.ema.b_simple

    def pair(self, sq_norm_small: float, sq_norm_big: float, b_small: float, b_big: float,
             estimator: str = "two_batch", step: int | None = None) -> NoiseSample:
        """One pair of squared norms at the same weights: a batch of b_small units and one of b_big."""
        return self.micro_batches([sq_norm_small], [b_small], sq_norm_big, b_big, estimator=estimator, step=step)

    def devices(self, local_sq_norm: float, reduced_sq_norm: float, b_local: float, b_global: float,
                step: int | None = None) -> NoiseSample:
        """Data parallel: |g|^2 of a device's gradient before the all-reduce (b_local units: its share), or the
        mean over the devices of theirs, and |g|^2 of the averaged gradient after it (b_global units)."""
        return self.pair(local_sq_norm, reduced_sq_norm, b_local, b_global, estimator="devices", step=step)

    def micro_batches(self, sq_norms: Sequence[float], sizes: Sequence[float], sq_norm_big: float,
                      b_big: float | None = None, estimator: str = "micro_batch",
                      step: int | None = None) -> NoiseSample:
        """Gradient accumulation: each listed micro-batch's own mean-loss gradient's |g|^2 and its size, and the
        accumulated batch's (b_big: default the sum of `sizes`; give it when only some micro-batches are
        listed). The step's estimate is the mean of the micro-batches' two-batch estimates."""
        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}")
        big = float(sum(sizes)) if b_big is None else b_big
        if len(sq_norms) != len(sizes) or not sizes or not all(0 < b < big for b in sizes):
            raise ValueError(f"need one size per small batch, each > 0 and < the big batch's {big:g}; got sizes "
                             f"{list(sizes)} for {len(sq_norms)} squared norms")
        if all(math.isfinite(s) for s in sq_norms) and math.isfinite(sq_norm_big):
            grad_sq, trace = micro_batch_estimate(sq_norms, sizes, sq_norm_big, big)
        else:   # a step whose gradients overflowed (a GradScaler's skipped step): no sample
            grad_sq, trace = math.nan, math.nan
        self.ema = add_to_ema(self.ema, grad_sq, trace)
        self.last = NoiseSample(estimator, sum(sizes) / len(sizes), big, grad_sq, trace, ratio(trace, grad_sq),
                                self.ema.b_simple, step)
        return self.last

    def state_dict(self) -> dict[str, Any]:
        """The EMA's state (plain numbers)."""
        return dataclasses.asdict(self.ema)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = NoiseScaleEMA(**state)
