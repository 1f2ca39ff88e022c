"""Gradient-accumulation plans: reach a batch size larger than memory allows.

A plan splits each optimizer update of `batch_size` examples into `accumulation_steps` micro-batches of
`micro_batch_size` examples. The micro-batch divides the batch exactly, so the accumulated gradient is
the full batch's (bsresearch.train weights each micro-batch's mean loss by its share), and
`cfg.replace(micro_batch_size=plan.micro_batch_size)` is a RunConfig the trainer accepts. BatchNorm
statistics then come from micro-batches (schedule.bn_statistics_batch records it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ConfigError, RunConfig
from .fit import MemoryFit


@dataclass(frozen=True)
class AccumulationPlan:
    """How to train at batch_size within a memory limit. Sizes in examples."""
    batch_size: int             # examples per optimizer update: the quantity being studied
    micro_batch_size: int       # examples per forward/backward pass; divides batch_size
    accumulation_steps: int     # batch_size // micro_batch_size
    max_micro_batch_size: int   # the largest micro-batch the memory limit allows
    predicted_bytes: float | None = None   # fitted peak at micro_batch_size (when planned from a fit)
    memory_budget: int | None = None

    def apply(self, cfg: RunConfig) -> RunConfig:
        """cfg at this plan's batch size and micro-batch size (a RunConfig the trainer accepts)."""
        return cfg.replace(batch_size=self.batch_size, micro_batch_size=self.micro_batch_size)


def largest_divisor_at_most(n: int, bound: int) -> int:
    """The largest divisor of n that is <= bound (1 at least)."""
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for candidate in (d, n // d):
                if best < candidate <= bound:
                    best = candidate
    return best


def accumulation_plan(batch_size: int, max_micro_batch_size: int) -> AccumulationPlan:
    """The fewest accumulation steps for batch_size with micro-batches of at most max_micro_batch_size.

    The micro-batch is the largest divisor of batch_size within the limit (so a batch of 1000 with a
    limit of 300 uses 5 x 200, not an uneven split).
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer; got {batch_size}")
    if max_micro_batch_size < 1:
        raise ConfigError(f"not even one example fits in memory (the largest micro-batch is "
                          f"{max_micro_batch_size}); raise the memory budget or use a smaller model")
    micro = largest_divisor_at_most(batch_size, max_micro_batch_size)
    return AccumulationPlan(batch_size=batch_size, micro_batch_size=micro, accumulation_steps=batch_size // micro,
                            max_micro_batch_size=max_micro_batch_size)


def plan_for_budget(batch_size: int, fit: MemoryFit, memory_budget: int,
                    safety_margin: float = 0.1) -> AccumulationPlan:
    """accumulation_plan with the largest micro-batch the fitted memory model allows within
    memory_budget bytes less safety_margin (and less the fit's largest residual)."""
    limit = fit.largest_batch(memory_budget, safety_margin)
    plan = accumulation_plan(batch_size, limit)
    return AccumulationPlan(plan.batch_size, plan.micro_batch_size, plan.accumulation_steps, limit,
                            predicted_bytes=fit.predict(plan.micro_batch_size), memory_budget=memory_budget)
