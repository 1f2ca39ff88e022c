"""FLOPs per training step, and achieved FLOP/s as a fraction of the GPU's peak.

FLOPs are counted by torch.utils.flop_counter.FlopCounterMode on a copy of the model on the meta
device (shapes only: nothing is computed, so any batch size is free to count, on any machine). It
counts matrix multiplications and convolutions, 2 FLOPs per multiply-add, in the forward and backward
pass; elementwise work (activations, BatchNorm, the loss) and the optimizer update are not counted,
which for these models is a small share of the arithmetic but not of the time.

Peaks are the vendors' dense (not 2:4-sparsity) tensor-core numbers for bf16/fp16/tf32 and the
CUDA-core number for fp32, in FLOP/s, from the datasheets (where a datasheet quotes only the sparse
figure, half of it). A GPU not in the table gets no fraction: no guessing.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch.utils.flop_counter import FlopCounterMode

from ..losses import loss_for

TERA = 1e12


@dataclass(frozen=True)
class GpuPeak:
    """Dense peak FLOP/s of one GPU model, per arithmetic type."""
    name: str
    pattern: str                 # regex matched (case-insensitive) against torch.cuda.get_device_name
    peaks: dict[str, float]      # 'fp32' (CUDA cores), 'tf32', 'bf16', 'fp16' (dense tensor cores) -> FLOP/s


def _peak(name: str, pattern: str, fp32: float, tf32: float | None, bf16: float | None, fp16: float) -> GpuPeak:
    values = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16}
    return GpuPeak(name, pattern, {k: v * TERA for k, v in values.items() if v is not None})


# Dense TFLOP/s from NVIDIA datasheets. Order matters: the first matching pattern wins.
GPU_PEAKS: tuple[GpuPeak, ...] = (
    _peak("H100 SXM", r"H100.*(SXM|HBM3)", 67.0, 494.5, 989.5, 989.5),
    _peak("H100 PCIe", r"H100.*PCIe", 51.0, 378.0, 756.5, 756.5),
    _peak("H100 NVL", r"H100.*NVL", 60.0, 417.5, 835.5, 835.5),
    _peak("H200 NVL", r"H200.*NVL", 60.0, 417.5, 835.5, 835.5),
    _peak("H200 SXM", r"\bH200", 67.0, 494.5, 989.5, 989.5),
    _peak("GH200", r"\bGH200", 67.0, 494.5, 989.5, 989.5),
    _peak("A100", r"A100", 19.5, 156.0, 312.0, 312.0),
    _peak("L40S", r"L40S", 91.6, 183.0, 366.5, 366.5),
    _peak("L4", r"\bL4\b", 30.3, 60.0, 121.0, 121.0),
    _peak("A10", r"\bA10\b", 31.2, 62.5, 125.0, 125.0),
    _peak("V100 SXM2", r"V100.*SXM", 15.7, None, None, 125.0),
    _peak("V100 PCIe", r"V100.*PCIE", 14.0, None, None, 112.0),
    _peak("T4", r"\bT4\b", 8.1, None, None, 65.0),
)


def gpu_peak(device_name: str) -> GpuPeak | None:
    """The table entry for a torch.cuda.get_device_name string, or None for a GPU not in the table."""
    return next((g for g in GPU_PEAKS if re.search(g.pattern, device_name, re.IGNORECASE)), None)


@dataclass(frozen=True)
class Tf32:
    """Whether torch may run fp32 work on TF32 tensor cores: convolutions (torch.backends.cudnn.allow_tf32, on
    by default) and matrix products (torch.backends.cuda.matmul.allow_tf32, off by default)."""
    convolutions: bool
    matmuls: bool


def tf32_settings() -> Tf32:
    """This process's TF32 settings."""
    return Tf32(bool(torch.backends.cudnn.allow_tf32), bool(torch.backends.cuda.matmul.allow_tf32))


@dataclass(frozen=True)
class StepFlops:
    """FLOPs of one step, and how many of them are convolutions (the rest: matrix products)."""
    total: int
    convolution: int = 0


def step_peak(device_name: str, precision: str, flops: StepFlops, tf32: Tf32) -> tuple[str | None, float | None]:
    """(the arithmetic, its dense peak FLOP/s) that a step at `precision` is compared with; (None, None) for a
    GPU not in the table.

    bf16/fp16: their tensor cores. fp32: convolutions on TF32 tensor cores or the fp32 CUDA cores as `tf32`
    says, and matrix products likewise; a step with both kinds on different arithmetic gets the peak of its
    mix, total FLOPs over the time each kind would take at its own peak ("fp32+tf32")."""
    if precision in ("bf16", "fp16"):
        peak = peak_flops(device_name, precision)
        return (precision, peak) if peak else (None, None)
    matmul_dtype = "tf32" if tf32.matmuls else "fp32"
    kinds = [(n, dtype) for n, dtype in ((flops.convolution, "tf32" if tf32.convolutions else "fp32"),
                                         (flops.total - flops.convolution, matmul_dtype)) if n > 0]
    if not kinds:  # nothing counted: the matrix products' peak
        kinds = [(1, matmul_dtype)]
    peaks = [peak_flops(device_name, dtype) for _, dtype in kinds]
    known = [p for p in peaks if p is not None]
    if len(known) < len(peaks):
        return None, None
    seconds = sum(n / p for (n, _), p in zip(kinds, known))
    return "+".join(sorted({dtype for _, dtype in kinds})), sum(n for n, _ in kinds) / seconds


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of the named GPU for dtype ('fp32', 'tf32', 'bf16', 'fp16'); None if unknown.

    A known GPU without that dtype (TF32 on a V100) falls back to its fp32 peak for 'tf32', else None.
    """
    entry = gpu_peak(device_name)
    if entry is None:
        return None
    if dtype == "tf32" and "tf32" not in entry.peaks:
        dtype = "fp32"
    return entry.peaks.get(dtype)


def count_flops(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, batch_size: int,
                backward: bool = True, example: tuple[torch.Tensor, torch.Tensor] | None = None,
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> int:
    """FLOPs of one forward (and backward) pass of `model` on a batch of batch_size: float inputs of
    input_shape and class labels, with the mean cross-entropy; or, given an `example` batch (inputs,
    targets), inputs and targets of its shapes and dtypes, with `loss_fn` (a user's model and data).

    Counted on a deep copy moved to the meta device: the model itself is untouched and nothing runs.
    The input does not require grad, as in training (the first layer computes no input gradient).
    """
    return count_step_flops(model, input_shape, num_classes, batch_size, backward, example, loss_fn).total


def count_step_flops(model: nn.Module, input_shape: tuple[int, ...], num_classes: int, batch_size: int,
                     backward: bool = True, example: tuple[torch.Tensor, torch.Tensor] | None = None,
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> StepFlops:
    """count_flops, with the convolutions' share (which arithmetic they run on can differ from the matrix
    products': `step_peak`). A model whose forward reads its inputs' values (a Hugging Face model's padding
    check, `.item()`), which the meta device cannot, is counted on a CPU copy on the example batch, cycled."""
    if example is None:
        meta = copy.deepcopy(model).to("meta")
        x = torch.empty((batch_size, *input_shape), device="meta")
        y = torch.zeros((batch_size,), dtype=torch.long, device="meta").clamp(max=num_classes - 1)
        return _counted(meta, x, y, backward, loss_fn)
    try:
        x = pytree.tree_map(lambda t: torch.zeros((batch_size, *t.shape[1:]), dtype=t.dtype, device="meta"),
                            example[0])
        y = torch.zeros((batch_size, *example[1].shape[1:]), dtype=example[1].dtype, device="meta")
        return _counted(copy.deepcopy(model).to("meta"), x, y, backward, loss_fn)
    except RuntimeError as exc:
        if "meta" not in str(exc):
            raise
    index = torch.arange(batch_size) % len(example[1])
    x = pytree.tree_map(lambda t: t[index].cpu(), example[0])
    return _counted(copy.deepcopy(model).cpu(), x, example[1][index].cpu(), backward, loss_fn)


def _counted(model: nn.Module, x: object, y: torch.Tensor, backward: bool,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None) -> StepFlops:
    with FlopCounterMode(display=False) as counter:
        loss = loss_for(loss_fn or F.cross_entropy).of(model, x, y)  # type: ignore[arg-type]
        if backward:
            loss.backward()
    by_op = counter.get_flop_counts().get("Global", {})
    convolution = sum(n for op, n in by_op.items() if "convolution" in str(op))
    return StepFlops(int(counter.get_total_flops()), int(convolution))
