"""Gradient-accumulation plans: reach a batch size larger than memory allows.

A plan splits each optimizer update of `batch_size` examples into `accumulation_steps` micro-batches of
`micro_batch_size` examples. The micro-batch divides the batch exactly, so the accumulated gradient is
the full batch's (bsresearch.train weights each micro-batch's mean loss by its share), and
`cfg.replace(micro_batch_size=plan.micro_batch_size)` is a RunConfig the trainer accepts. BatchNorm
statistics then come from micro-batches (schedule.bn_statistics_batch records it).

On several devices (RunConfig.devices) memory is each device's: every micro-batch is split over the devices
and each device must hold its share, so the limit is on the per-device micro-batch (micro_batch_size /
devices), and the largest batch that fits one device fits devices times over without accumulation. An
out-of-memory error on one device is one of the run.
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
    max_micro_batch_size: int   # the largest micro-batch the memory limit allows (on one device)
    predicted_bytes: float | None = None   # fitted peak at micro_batch_size (when planned from a fit)
    memory_budget: int | None = None
    devices: int = 1            # devices sharing each micro-batch (each runs micro_batch_size / devices)

    @property
    def per_device_batch(self) -> int:
        """Examples one device runs at once: micro_batch_size / devices."""
        return self.micro_batch_size // self.devices

    def apply(self, cfg: RunConfig) -> RunConfig:
        """cfg at this plan's batch size and micro-batch size (a RunConfig the trainer accepts)."""
        micro = self.micro_batch_size if self.micro_batch_size < self.batch_size else None
        if self.devices == 1:
            return cfg.replace(batch_size=self.batch_size, micro_batch_size=self.micro_batch_size)
        return cfg.replace(batch_size=self.batch_size, micro_batch_size=micro, devices=self.devices)


def largest_divisor_at_most(n: int, bound: int) -> int:
    """The largest divisor of n that is <= bound (1 at least)."""
    best = 1
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            for candidate in (d, n // d):
                if best < candidate <= bound:
                    best = candidate
    return best


def check_shares(batch_size: int, devices: int, name: str = "batch_size") -> None:
    """ConfigError (one line, naming `name`) unless batch_size splits into `devices` equal per-device shares."""
    if batch_size % devices:
        raise ConfigError(f"{name} {batch_size} does not split into {devices} equal per-device shares; accepted: "
                          f"a multiple of {devices}")


def accumulation_plan(batch_size: int, max_micro_batch_size: int, devices: int = 1) -> AccumulationPlan:
    """The fewest accumulation steps for batch_size with micro-batches of at most max_micro_batch_size.

    The micro-batch is the largest divisor of batch_size within the limit (so a batch of 1000 with a
    limit of 300 uses 5 x 200, not an uneven split). On `devices` devices the limit is each device's: a
    micro-batch is devices x a per-device batch of at most max_micro_batch_size, which divides
    batch_size / devices.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer; got {batch_size}")
    if max_micro_batch_size < 1:
        raise ConfigError(f"not even one example fits in memory (the largest micro-batch is "
                          f"{max_micro_batch_size}); raise the memory budget or use a smaller model")
    if devices < 1:
        raise ConfigError(f"devices must be a positive integer (1, 2, ...); got {devices!r}")
    check_shares(batch_size, devices)
    share = largest_divisor_at_most(batch_size // devices, max_micro_batch_size)
    micro = share * devices
    return AccumulationPlan(batch_size=batch_size, micro_batch_size=micro, accumulation_steps=batch_size // micro,
                            max_micro_batch_size=max_micro_batch_size, devices=devices)


def plan_for_budget(batch_size: int, fit: MemoryFit, memory_budget: int,
                    safety_margin: float = 0.1, devices: int = 1) -> AccumulationPlan:
    """accumulation_plan with the largest micro-batch the fitted memory model allows within
    memory_budget bytes less safety_margin (and less the fit's largest residual); on `devices` devices, the
    fit and the budget are one device's and its share must fit."""
    limit = fit.largest_batch(memory_budget, safety_margin)
    plan = accumulation_plan(batch_size, limit, devices)
    return AccumulationPlan(plan.batch_size, plan.micro_batch_size, plan.accumulation_steps, limit,
                            predicted_bytes=fit.predict(plan.per_device_batch), memory_budget=memory_budget,
                            devices=devices)


def largest_batch_on_devices(largest_per_device: int, devices: int) -> int:
    """The largest global batch that trains without accumulation on `devices` devices, each of which holds at
    most `largest_per_device` examples (the largest batch that fits one device, systems.search): every device
    must fit its share."""
    return largest_per_device * devices
