"""Throughput: seconds per training (or inference) step and examples per second over batch sizes.

Every timing is synchronised: on CUDA with a pair of CUDA events around the steps (the GPU's own clock,
read after the end event has completed); elsewhere with time.perf_counter and a device synchronize
before reading the clock. Warm-up steps come first (allocator growth, cuDNN autotuning, lazy init),
then `repeats` timings of `steps` consecutive steps each; the table reports the median and the
quartiles over repeats. The usual tutorial times one unsynchronised step, which on a GPU measures only
how fast Python queues kernels.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import pandas as pd
import torch

from ..runtime import is_out_of_memory, synchronize
from .workload import Workload, build_parts, free_memory, inference_step, train_on_batch, workload_batch

_clock = time.perf_counter  # a module attribute so tests can substitute a fake clock

MODES = ("train", "inference")


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with `threads` intra-op threads (None or 0: leave as is), restoring the old number."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def time_steps(step: Callable[[], object], device: torch.device, steps: int, repeats: int,
               warmup: int) -> list[float]:
    """Seconds per step, one value per repeat: each repeat times `steps` consecutive calls of `step`.

    `warmup` untimed calls come first. On CUDA the time is the elapsed time between two CUDA events
    recorded around the calls; otherwise perf_counter around the calls with the device synchronised
    before each clock reading.
    """
    for _ in range(warmup):
        step()
    synchronize(device)
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                step()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000.0  # elapsed_time is in milliseconds
        else:
            synchronize(device)
            t0 = _clock()
            for _ in range(steps):
                step()
            synchronize(device)
            seconds = _clock() - t0
        out.append(seconds / steps)
    return out


def steps_for(step: Callable[[], object], device: torch.device, min_seconds: float, max_steps: int = 1000) -> int:
    """How many consecutive steps make one repeat last at least `min_seconds` (from one timed step)."""
    if min_seconds <= 0:
        return 1
    one = time_steps(step, device, steps=1, repeats=1, warmup=0)[0]
    return int(min(max_steps, max(1, math.ceil(min_seconds / max(one, 1e-9)))))


def summarise(seconds: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max of per-step seconds over repeats (quartiles by linear interpolation)."""
    values = sorted(seconds)
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"seconds_per_step": statistics.median(values), "seconds_q1": q1, "seconds_q3": q3,
            "seconds_min": values[0], "seconds_max": values[-1]}


def measure_throughput(workload: Workload, batch_sizes: Sequence[int], device: torch.device | str,
                       mode: str = "train", warmup: int = 3, repeats: int = 5, min_seconds: float = 0.05,
                       threads: int | None = 1, stop_at_oom: bool = True) -> pd.DataFrame:
    """Time `workload` at each batch size (ascending); one row per batch size.

    Each batch size gets fresh parts (same initial weights, empty optimizer state) and one fixed
    synthetic batch resident on the device, so the time is the step's compute and Python overhead, not
    data loading. mode 'train' times `train_on_batch` (model in train mode: BatchNorm batch statistics);
    'inference' times a forward pass under torch.inference_mode in eval mode. Each repeat lasts at least
    `min_seconds`. On the CPU the timing runs with `threads` torch threads (default 1).

    Columns: model, precision, optimizer, mode, batch_size, status ('ok' or 'oom'), seconds_per_step
    (median over repeats), seconds_q1/q3/min/max, examples_per_second (batch_size / median), repeats,
    steps_per_repeat, warmup, timer, device. A batch size that raises torch.OutOfMemoryError gets
    status 'oom'; with stop_at_oom the larger ones are not tried.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    device = torch.device(device)
    rows = []
    with torch_threads(threads if device.type == "cpu" else None):
        for batch_size in sorted(set(batch_sizes)):
            row = {"model": workload.cfg.model, "precision": workload.cfg.precision,
                   "optimizer": workload.cfg.optimizer, "mode": mode, "batch_size": batch_size}
            try:
                row.update(_time_one(workload, batch_size, device, mode, warmup, repeats, min_seconds))
                row["status"] = "ok"
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                row["status"] = "oom"
            free_memory(device, after_failure=row["status"] != "ok")
            row.update(device=str(device), threads=torch.get_num_threads() if device.type == "cpu" else None)
            rows.append(row)
            if row["status"] == "oom" and stop_at_oom:
                break
    return _ordered(pd.DataFrame(rows))


def _time_one(workload: Workload, batch_size: int, device: torch.device, mode: str, warmup: int,
              repeats: int, min_seconds: float) -> dict[str, object]:
    parts = build_parts(workload, device)
    x, y = workload_batch(workload, batch_size, device)
    if mode == "train":
        def step() -> object:
            return train_on_batch(parts, x, y, workload.loss)
    else:
        parts.model.eval()

        def step() -> object:
            return inference_step(parts, x)
    step()  # the first call allocates and autotunes: never part of a timing
    steps = steps_for(step, device, min_seconds)
    seconds = time_steps(step, device, steps=steps, repeats=repeats, warmup=warmup)
    stats = summarise(seconds)
    return {**stats, "examples_per_second": batch_size / stats["seconds_per_step"],
            "repeats": repeats, "steps_per_repeat": steps, "warmup": warmup,
            "timer": "cuda_events" if device.type == "cuda" else "perf_counter"}


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    first = ["model", "precision", "optimizer", "mode", "batch_size", "status", "examples_per_second",
             "seconds_per_step", "seconds_q1", "seconds_q3", "seconds_min", "seconds_max"]
    return df[[c for c in first if c in df] + [c for c in df if c not in first]]

