"""BatchNorm over a device group's global batch (sync_batchnorm): torch's SyncBatchNorm on CUDA, and on the CPU,
where it does not run, AllReduceBatchNorm (the count, sum and sum of squares of each channel all-reduced).
swap_batchnorm puts one in place of each BatchNorm of a model, sharing its tensors; restore_batchnorm puts the
originals back."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn


class _SumOverDevices(torch.autograd.Function):
    """The sum of a tensor over the group's devices; its gradient is the sum of the devices' gradients (each
    device's loss depends on every device's input through the sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        dist.all_reduce(out)
        return out


class AllReduceBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the global batch on the CPU, where torch's SyncBatchNorm does not run: in training, the
    count, sum and sum of squares of each channel are all-reduced (differentiably: the backward all-reduces
    their gradients) and every device normalises with the global mean and (biased) variance; the running
    statistics take the global mean and unbiased variance. The statistics are summed in float64. Outside
    a group, or in eval mode, it is BatchNorm."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)
        channels, dims = x.shape[1], [0, *range(2, x.dim())]
        x64 = x.double()
        count = torch.full((1,), x.numel() // channels, dtype=torch.float64, device=x.device)
        total = _SumOverDevices.apply(torch.cat([x64.sum(dims), (x64 * x64).sum(dims), count]))
        n = total[-1]
        mean = total[:channels] / n
        var = (total[channels:2 * channels] / n - mean * mean).clamp_min(0)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                assert self.num_batches_tracked is not None
                self.num_batches_tracked.add_(1)
                factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                unbiased = var * n / (n - 1).clamp_min(1)
                self.running_mean.mul_(1 - factor).add_(factor * mean.to(self.running_mean.dtype))
                self.running_var.mul_(1 - factor).add_(factor * unbiased.to(self.running_var.dtype))
        shape = [1, channels] + [1] * (x.dim() - 2)
        out = (x - mean.to(x.dtype).view(shape)) * torch.rsqrt(var.to(x.dtype) + self.eps).view(shape)
        if self.weight is not None and self.bias is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def _sync_twin(module: nn.modules.batchnorm._BatchNorm, cuda: bool) -> nn.Module:
    """A BatchNorm over the global batch that shares `module`'s parameters and buffers (the same tensors, so
    the optimizer and the checkpoint see no change)."""
    twin: nn.modules.batchnorm._BatchNorm
    if cuda:
        twin = nn.SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                module.track_running_stats)
    else:
        twin = AllReduceBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats)
    for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
        setattr(twin, name, tensor)
    twin.train(module.training)
    return twin


def swap_batchnorm(model: nn.Module, cuda: bool) -> list[tuple[nn.Module, str, nn.Module]]:
    """Put a global-batch BatchNorm (_sync_twin) in place of every BatchNorm of `model`; returns (parent, name,
    original) of each, for restore_batchnorm."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm) and \
                    not isinstance(child, (AllReduceBatchNorm, nn.SyncBatchNorm)):
                setattr(parent, name, _sync_twin(child, cuda))
                swapped.append((parent, name, child))
    return swapped


def restore_batchnorm(swapped: list[tuple[nn.Module, str, nn.Module]]) -> None:
    """Put the original BatchNorm modules back (their tensors are the ones that trained)."""
    for parent, name, original in swapped:
        original.train(getattr(parent, name).training)
        setattr(parent, name, original)

