"""Peak memory of a training step, split into parameters, gradients, optimizer state, inputs and activations.

CUDA: exact, from the caching allocator. Before the step the peak statistics are reset; the peak is
`torch.cuda.max_memory_allocated` over the step. Parameters, gradients, optimizer state and the input
batch are counted from their tensors; "activations" is the rest of the peak (the step's peak minus what
was resident before it, minus the gradients): tensors saved for backward, their gradients during
backward, cuBLAS/cuDNN workspaces and temporaries. `other_bytes` is memory resident before the step
that is none of these (another model, a dataset on the device).

CPU: best effort, by accounting. Parameters, gradients, optimizer state and inputs are counted from
their tensors; activations are the bytes of the tensors autograd saves for backward during the forward
pass (`torch.autograd.graph.saved_tensors_hooks`), each storage counted once, parameters and inputs
excluded (autocast's low-precision weight copies are included). It misses the allocator's overhead and
fragmentation, backward-pass temporaries (gradients of activations, which live briefly), workspace
buffers and the Python/autograd graph objects, so it is a lower bound on the process's true peak; it is
exactly linear in the batch size for these models, which is what the fitted memory model needs.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

import pandas as pd
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from ..runtime import is_out_of_memory, synchronize
from .workload import TrainParts, Workload, build_parts, free_memory, restore, snapshot, train_on_batch, workload_batch


@dataclass(frozen=True)
class StepMemory:
    """Memory of one training step at batch_size, in bytes. peak = params + grads + optimizer + inputs +
    activations + other."""
    batch_size: int
    peak_bytes: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    input_bytes: int
    activation_bytes: int
    other_bytes: int             # CUDA: resident before the step but none of the above; CPU: 0
    saved_bytes: int             # bytes autograd saved for backward (params and inputs excluded), both devices
    reserved_bytes: int | None   # CUDA: the allocator's peak reserved memory (what runs out); CPU: None
    method: str                  # 'cuda_allocator_peak' | 'cpu_tensor_accounting'


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def tensor_bytes(tensors, exclude: set | None = None) -> int:
    """Bytes of the distinct storages behind `tensors` (views counted once), minus excluded storages."""
    seen = set(exclude or ())
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor held in the optimizer's per-parameter state (momentum buffers, Adam moments, steps)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


@contextlib.contextmanager
def count_saved_bytes(exclude: set) -> Iterator[list[int]]:
    """Count the bytes of tensors saved for backward inside the block; `out[0]` holds the total after it."""
    seen = set(exclude)
    out = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            key = _storage_key(t)
            if key not in seen:
                seen.add(key)
                out[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield out


def step_memory(parts: TrainParts, x: torch.Tensor, y: torch.Tensor,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy) -> StepMemory:
    """Memory of one training step on (x, y) after one warm-up step (so optimizer state exists); loss_fn is
    the step's mean-reduced loss (default cross-entropy).

    The parts are restored exactly afterwards (this measurement changes nothing). May raise
    torch.OutOfMemoryError; the parts are restored then too.
    """
    device = x.device
    snap = snapshot(parts)
    try:
        train_on_batch(parts, x, y, loss_fn)  # steady state: optimizer state allocated, as in every later step
        parts.optimizer.zero_grad(set_to_none=True)
        params = list(parts.model.parameters())
        param_keys = {_storage_key(p) for p in params}
        inputs = [*pytree.tree_leaves(x), y]   # a tensor, or named tensors (batch.Features)
        input_keys = {_storage_key(t) for t in inputs}
        param_bytes = tensor_bytes(params)
        optimizer_bytes = tensor_bytes(optimizer_tensors(parts.optimizer))
        input_bytes = tensor_bytes(inputs)
        if device.type == "cuda":
            synchronize(device)
            resident = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        with count_saved_bytes(param_keys | input_keys) as saved:
            train_on_batch(parts, x, y, loss_fn)
        grad_bytes = tensor_bytes([p.grad for p in params if p.grad is not None])
        if device.type == "cuda":
            synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
            reserved = torch.cuda.max_memory_reserved(device)
            other = max(0, resident - param_bytes - optimizer_bytes - input_bytes)
            activations = max(0, peak - resident - grad_bytes)
            method = "cuda_allocator_peak"
        else:
            reserved, other, activations = None, 0, saved[0]
            peak = param_bytes + grad_bytes + optimizer_bytes + input_bytes + activations
            method = "cpu_tensor_accounting"
        return StepMemory(batch_size=len(x), peak_bytes=int(peak), param_bytes=param_bytes, grad_bytes=grad_bytes,
                          optimizer_bytes=optimizer_bytes, input_bytes=input_bytes,
                          activation_bytes=int(activations), other_bytes=int(other), saved_bytes=saved[0],
                          reserved_bytes=None if reserved is None else int(reserved), method=method)
    finally:
        restore(parts, snap)


def measure_memory(workload: Workload, batch_sizes: Sequence[int], device: torch.device | str,
                   memory_budget: int | None = None, stop_at_oom: bool = True) -> pd.DataFrame:
    """Peak memory per batch size (ascending), one row each: the StepMemory fields plus model, precision,
    optimizer, status and device.

    Each batch size gets fresh parts. status is 'oom' when the step raised torch.OutOfMemoryError (on
    CUDA under `memory_cap(memory_budget)`) or, on the CPU, when the accounted peak exceeds
    memory_budget; with stop_at_oom the larger sizes are not tried.
    """
    device = torch.device(device)
    rows = []
    with memory_cap(memory_budget, device):
        for batch_size in sorted(set(batch_sizes)):
            row = {"model": workload.cfg.model, "precision": workload.cfg.precision,
                   "optimizer": workload.cfg.optimizer, "batch_size": batch_size}
            try:
                parts = build_parts(workload, device)
                x, y = workload_batch(workload, batch_size, device)
                mem = step_memory(parts, x, y, workload.loss)
                row.update(asdict(mem))
                over = memory_budget is not None and device.type != "cuda" and mem.peak_bytes > memory_budget
                row["status"] = "oom" if over else "ok"
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                row["status"] = "oom"
            parts = x = y = None
            free_memory(device, after_failure=row["status"] != "ok")
            row["device"] = str(device)
            rows.append(row)
            if row["status"] == "oom" and stop_at_oom:
                break
    return pd.DataFrame(rows)


@contextlib.contextmanager
def memory_cap(memory_budget: int | None, device: torch.device) -> Iterator[None]:
    """On CUDA, cap this process's allocator at `memory_budget` bytes for the block (through
    torch.cuda.set_per_process_memory_fraction), so allocations beyond it raise torch.OutOfMemoryError;
    the previous fraction is restored afterwards. Elsewhere, or with no budget, it does nothing (the CPU
    budget is enforced by the callers, from the fitted memory model).
    """
    if memory_budget is None or device.type != "cuda":
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    previous = getter(index) if getter else 1.0
    free_memory(device)  # cached blocks above the cap would otherwise count against it
    torch.cuda.set_per_process_memory_fraction(min(1.0, memory_budget / total), index)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(previous, index)
