"""The largest batch that fits: double until out of memory, then binary-search, with a safety margin.

`search_batch_size` is the search alone, over any trial function (tested with a simulated OOM);
`largest_batch_size` runs it with real training steps on a live model and optimizer and restores both
exactly afterwards. Only running out of memory (runtime.is_out_of_memory: torch.OutOfMemoryError, or
the CPU allocator's RuntimeError) counts as "does not fit": any other error is a bug and propagates. On
CUDA the memory_budget is enforced by the allocator (a per-process memory fraction); on the CPU, where
the OOM killer may strike before the allocator fails, by the fitted memory model: a trial whose
predicted peak exceeds the budget raises OutOfMemoryError without running.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..runtime import is_out_of_memory, oom_message
from .fit import MemoryFit, fit_memory
from .memory import memory_cap, step_memory
from .workload import TrainParts, Workload, free_memory, restore, snapshot, train_on_batch, workload_batch


@dataclass(frozen=True)
class BatchSearch:
    """Result of the search. Sizes in examples."""
    largest_batch_size: int               # largest size that ran (0: none did)
    safe_batch_size: int                  # largest_batch_size x (1 - safety_margin), down to a multiple_of
    first_failure: int | None             # smallest size that ran out of memory (None: none did)
    tried: tuple[tuple[int, bool], ...]   # (batch size, fitted) in the order tried
    limit: int                            # the search never tried more than this
    safety_margin: float

    @property
    def reached_limit(self) -> bool:
        """True when `limit` itself fitted: the real boundary lies beyond it."""
        return self.largest_batch_size == self.limit

    @property
    def sizes_tried(self) -> list[int]:
        return [b for b, _ in self.tried]


def search_batch_size(trial: Callable[[int], object], start: int = 1, limit: int = 2 ** 20,
                      safety_margin: float = 0.1, multiple_of: int = 1,
                      device: torch.device | None = None) -> BatchSearch:
    """Find the largest batch size for which `trial(batch_size)` does not raise torch.OutOfMemoryError.

    Doubling from `start` (start, 2 start, 4 start, ..., capped at `limit`) until a trial fails, then
    binary search between the last success and the first failure, to the exact size. A failing start
    continues the binary search below it. Memory is freed after every trial (garbage collection, and the
    CUDA cache when `device` is CUDA). The safe size leaves `safety_margin` of the largest for the
    fragmentation and the variation a real run meets, rounded down to a multiple of `multiple_of` when
    that leaves at least one multiple.
    """
    if not 1 <= start <= limit:
        raise ValueError(f"need 1 <= start <= limit; got start {start}, limit {limit}")
    if not 0.0 <= safety_margin < 1.0:
        raise ValueError(f"safety_margin must be in [0, 1); got {safety_margin}")
    tried: list[tuple[int, bool]] = []

    def fits(batch_size: int) -> bool:
        try:
            trial(batch_size)
            ok = True
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            ok = False  # the exception (and the frames holding the trial's tensors) is released here
        free_memory(device or torch.device("cpu"), after_failure=not ok)
        tried.append((batch_size, ok))
        return ok

    low, high = 0, None  # low fits (0: nothing yet); high does not
    size = start
    while True:
        if fits(size):
            low = size
            if size == limit:
                break
            size = min(2 * size, limit)
        else:
            high = size
            break
    if high is not None:
        while high - low > 1:
            mid = (low + high) // 2
            if fits(mid):
                low = mid
            else:
                high = mid
    safe = int(low * (1.0 - safety_margin))
    if multiple_of > 1 and safe >= multiple_of:
        safe -= safe % multiple_of
    return BatchSearch(largest_batch_size=low, safe_batch_size=safe, first_failure=high, tried=tuple(tried),
                       limit=limit, safety_margin=safety_margin)


def largest_batch_size(parts: TrainParts, workload: Workload | None, memory_budget: int | None = None, start: int = 1,
                       limit: int = 2 ** 20, safety_margin: float = 0.1, multiple_of: int = 1,
                       fit: MemoryFit | None = None, fit_sizes: Sequence[int] | None = None,
                       batch_fn: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None,
                       loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> BatchSearch:
    """The largest training batch of `workload` that fits, by real training steps on `parts`.

    The batches are `batch_fn(batch_size)` (an (x, y) pair on the parts' device) when given, else the
    workload's batches (workload_batch); loss_fn is the step's mean-reduced loss (default: the workload's,
    else cross-entropy).

    Each trial is one training step on a synthetic batch; model, gradients, optimizer and scaler are
    restored exactly after every trial (and so after the search). On CUDA the allocator is capped at
    memory_budget bytes during the search. On the CPU a memory_budget is enforced through `fit` (or a fit
    measured on `parts` at `fit_sizes`, default start x 1, 2, 4, 8): a size predicted to exceed it
    raises torch.OutOfMemoryError without running. Without a budget on the CPU every trial runs for real
    up to `limit`, so keep the limit modest there.
    """
    device = parts.device
    if batch_fn is None:
        if workload is None:
            raise ValueError("largest_batch_size needs a workload or a batch_fn")
        def batch_fn(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
            return workload_batch(workload, batch_size, device)
    if loss_fn is None:
        loss_fn = workload.loss if workload is not None else F.cross_entropy
    if memory_budget is not None and device.type != "cuda" and fit is None:
        sizes = fit_sizes or [start * k for k in (1, 2, 4, 8)]
        fit = fit_memory(sizes, [step_memory(parts, *batch_fn(b), loss_fn).peak_bytes for b in sizes])
    snap = snapshot(parts)

    def trial(batch_size: int) -> None:
        if memory_budget is not None and device.type != "cuda":
            assert fit is not None  # fitted above whenever a CPU budget is given
            predicted = fit.predict(batch_size)
            if predicted > memory_budget:
                raise torch.OutOfMemoryError(f"batch {batch_size}: predicted peak {predicted:.4g} bytes exceeds "
                                             f"the memory budget {memory_budget} bytes (fitted CPU memory model)")
        failure = None
        try:
            train_on_batch(parts, *batch_fn(batch_size), loss_fn)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # an asynchronous failure must surface inside this trial
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            failure = oom_message(exc) if str(exc) else f"out of memory at batch {batch_size}"
        # The exception and the frames holding the step's tensors are gone here: on CUDA free them before
        # restoring (restoring while they were still alive could itself run out of memory).
        if device.type == "cuda":
            free_memory(device, after_failure=failure is not None)
        restore(parts, snap)
        if failure is not None:
            raise torch.OutOfMemoryError(failure)

    try:
        with memory_cap(memory_budget, device):
            # no device: each trial has already freed the device's memory, before restoring the state
            return search_batch_size(trial, start=start, limit=limit, safety_margin=safety_margin,
                                     multiple_of=multiple_of)
    finally:
        restore(parts, snap)
