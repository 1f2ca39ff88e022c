"""Systems measurements: throughput and memory vs batch size, the largest batch that fits, accumulation
plans, precision and optimizer comparison, FLOP/s, and a batch-size recommendation.

A Workload describes a training step (model, optimizer, precision, input shape); the measurements take
one, or live TrainParts built from it. See each module's docstring for what is measured and how.
Names are imported on first use (most modules import torch), so `bsresearch bench --help` stays fast.
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> module defining it
_API = {
    "bench": ["BenchResult", "device_label", "preset_workloads", "run_bench", "write_bench"],
    "presets": ["PRESETS", "Preset", "powers_of_two"],
    "compare": ["compare_precisions"],
    "fit": ["MemoryFit", "fit_memory", "fit_memory_table"],
    "flops": ["GPU_PEAKS", "GpuPeak", "StepFlops", "Tf32", "count_flops", "count_step_flops", "gpu_peak", "peak_flops",
              "step_peak", "tf32_settings"],
    "memory": ["StepMemory", "measure_memory", "memory_cap", "step_memory"],
    "plan": ["AccumulationPlan", "accumulation_plan", "check_shares", "largest_batch_on_devices", "plan_for_budget"],
    "recommend": ["Recommendation", "recommend_batch_size", "time_to_target"],
    "search": ["BatchSearch", "largest_batch_size", "search_batch_size"],
    "timing": ["measure_throughput", "time_steps"],
    "workload": ["INPUT_SHAPES", "TrainParts", "Workload", "build_parts", "inference_step", "model_workload",
                 "restore", "snapshot", "synthetic_batch", "train_on_batch", "workload_batch", "workload_for"],
}
_LAZY = {name: module for module, names in _API.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'bsresearch.systems' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))


__all__ = sorted(_LAZY)
