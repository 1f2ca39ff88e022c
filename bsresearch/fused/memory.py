"""How many members fit in one fused group on a CUDA device, from the memory model in systems/.

A fused step holds K copies of everything a single run's step holds (parameters, gradients, optimizer
state, the input batch and the activations), so its peak is about K x the single run's peak at the
same (micro-)batch size. The single run's peak comes from systems.fit_memory over two measured
(micro-)batch sizes; STACKED_OVERHEAD covers what the batched program adds (the unfolded convolution
inputs, the per-member parameter views). An out-of-memory error still splits the group (trainer.py):
this estimate only avoids starting with a group that cannot fit.

The one model of a group's size (train_group cuts its members into chunks of it). It measures the step a
member runs, at its micro-batch and half of it, never above it: a measurement at a larger batch could itself
run out of memory for a run that fits; and it counts what a fit of measured peaks can miss (its largest
residual) and what stacking adds (STACKED_OVERHEAD), so a first chunk rarely has to be split.
"""
from __future__ import annotations

import math

import torch

from ..config import RunConfig
from ..systems.fit import MemoryFit

STACKED_OVERHEAD = 2.0   # fused peak per member / separate run's peak (conservative; unfold copies inputs)
SAFETY_MARGIN = 0.2      # fraction of the free memory left unused (allocator rounding, fragmentation)


def group_size_for(fit: MemoryFit, micro_batch_size: int, free_bytes: float,
                   overhead: float = STACKED_OVERHEAD, safety_margin: float = SAFETY_MARGIN) -> int:
    """Largest K with K x overhead x fit.predict(micro_batch_size) <= free_bytes x (1 - safety_margin);
    at least 1 (a single member runs as its separate run would, OOM recorded if it does not fit)."""
    per_member = overhead * (fit.predict(micro_batch_size) + fit.max_residual_bytes)
    if per_member <= 0:
        return 1
    return max(1, math.floor(free_bytes * (1.0 - safety_margin) / per_member + 1e-6))  # 1e-6: fit rounding


def cuda_group_size(cfg: RunConfig, device: torch.device) -> int | None:
    """Members of `cfg`'s shape that fit in one group on `device` now; None on the CPU (no limit).

    Measures one separate step's peak at half and at the full (micro-)batch size on the device
    (systems.measure_memory), fits the linear model and divides the free memory by it.
    """
    if device.type != "cuda":
        return None
    from ..systems.fit import fit_memory_table
    from ..systems.memory import measure_memory
    from ..systems.workload import workload_for
    micro = cfg.micro_batch_size or cfg.batch_size
    table = measure_memory(workload_for(cfg), sorted({max(1, micro // 2), micro}) if micro > 1 else [1, 2], device)
    if (table["status"] != "ok").any():
        return 1
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return group_size_for(fit_memory_table(table), micro, free_bytes)
