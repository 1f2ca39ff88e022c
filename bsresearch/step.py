"""One optimizer update: the step that training runs and that the systems benchmarks time.

`optimizer_update` is the only place a training step is written. bsresearch.train calls it with a batch
sampled from the training set (split into micro-batches for gradient accumulation) and feeds the in-loop
noise-scale estimator through its hooks; bsresearch.systems calls it on synthetic batches to measure
time and memory, so a benchmark times exactly what a run executes.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import schedule
from .config import OPTIMIZERS, ConfigError, RunConfig
from .losses import loss_for
from .model_io import Inputs
from .runtime import autocast

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Count = Callable[[torch.Tensor], torch.Tensor]  # targets -> how many the loss averages over (Task.count)
Size = int | torch.Tensor   # a micro-batch's or a batch's examples, or (token-level) its real tokens, 0-d
AfterBackward = Callable[[int, Size, Size], None]   # (i, micro-batch i's size, the batch's): its share is their ratio


def optimizer_for(name: str, params: Iterable[torch.Tensor], lr: float = 0.0, momentum: float = 0.9,
                  nesterov: bool = False, weight_decay: float = 0.0, beta2: float = 0.999) -> torch.optim.Optimizer:
    """torch.optim's SGD (with momentum), Adam or AdamW (config.OPTIMIZERS) over `params`; Adam's beta1 is 0.9."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(0.9, beta2), weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, beta2), weight_decay=weight_decay)


def make_optimizer(cfg: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer cfg names, with lr 0: the caller sets every step's lr (the loop from `schedule.lr_at`), and
    Adam's beta2 for the step's batch size (`schedule.adam_beta2_at`)."""
    return optimizer_for(cfg.optimizer, model.parameters(), 0.0, cfg.momentum, cfg.nesterov, cfg.weight_decay,
                         schedule.adam_beta2_at(cfg, cfg.batch_size))


def micro_batch_loss(loss: torch.Tensor, n_micro: Size, n_batch: Size) -> torch.Tensor:
    """A micro-batch's mean loss weighted by its share of the batch, `loss * (n_micro / n_batch)`, so that the
    gradients accumulated over a batch's micro-batches are the whole batch's mean-loss gradient; the loss
    itself when the micro-batch is the whole batch (no accumulation). The one place this rule is written:
    optimizer_update and the fused engines (fused/engine.py) apply it, member by member there.

    Shares are of examples, or, for a token-level loss (a mean over a sequence's real tokens, targets of -100
    ignored), of the batch's real tokens: then n_micro and n_batch are 0-d tensors of tokens (Task.count), so
    accumulation over sequences of different lengths gives the whole batch's mean over its real tokens. A
    token share is computed in float64 and rounded to the loss's dtype, as a Python float share is, so where
    no target is ignored the result is the example share's bit for bit."""
    if isinstance(n_micro, torch.Tensor) or isinstance(n_batch, torch.Tensor):
        return loss * _token_share(n_micro, n_batch).to(device=loss.device, dtype=loss.dtype)
    return loss if n_micro == n_batch else loss * share_of(n_micro, n_batch)


def _token_share(n_micro: Size, n_batch: Size) -> torch.Tensor:
    return torch.as_tensor(n_micro, dtype=torch.float64) / torch.as_tensor(n_batch, dtype=torch.float64)


def share_of(n_micro: Size, n_batch: Size) -> float:
    """The weight micro_batch_loss gives a micro-batch of `n_micro` in a batch of `n_batch` (examples, or real
    tokens as 0-d tensors), as a Python float: the example share is the same float micro_batch_loss multiplies by;
    a token share is its float64 value (micro_batch_loss rounds it to the loss's dtype)."""
    if isinstance(n_micro, torch.Tensor) or isinstance(n_batch, torch.Tensor):
        return float(_token_share(n_micro, n_batch))
    return 1.0 if n_micro == n_batch else n_micro / n_batch


def optimizer_update(model: nn.Module, optimizer: torch.optim.Optimizer,
                     batches: Sequence[tuple[Inputs, torch.Tensor]], precision: str = "fp32",
                     scaler: torch.amp.GradScaler | None = None, loss_fn: LossFn = F.cross_entropy,
                     after_backward: AfterBackward | None = None,
                     before_update: Callable[[], None] | None = None, count: Count | None = None,
                     no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
                     total: torch.Tensor | None = None) -> torch.Tensor:
    """One optimizer update on the examples of `batches`; returns the batch's mean loss (a detached float32
    0-d tensor, not synchronised).

    `batches` are the micro-batches of one batch (a single (x, y) without accumulation). Each micro-batch's
    mean loss is weighted by its share of the batch (micro_batch_loss), so the accumulated gradient equals the
    whole batch's mean-loss gradient (BatchNorm aside: its statistics then come from micro-batches). The model stays in
    its current mode. Gradients are set to None first and kept after the update, so a step's memory is
    the trainer's. `after_backward(i, n_micro, n_batch)` runs after micro-batch i's backward pass (with the sizes
its share was computed from: share_of), `before_update()` after
    the last one, before the optimizer (and GradScaler, for fp16) update: the in-loop noise-scale
    estimator reads gradient norms there. With `count` (a token-level loss: Task.count) micro-batches are
    weighted by their share of the batch's real tokens instead of its examples. The inputs may be named
    tensors and the output anything batch.logits_of reads (losses.Loss.of runs the model into its loss).
    `no_sync` (a DistributedDataParallel model's, on several devices) wraps every micro-batch but the last, so
    their gradients accumulate without the all-reduce (bsresearch.devices). `total` (with `count`) is what
    the shares are of instead of this process's own count: on several devices, the global batch's real tokens
    over the number of devices, so that DDP's mean over devices is the global batch's mean over its real tokens.
    """
    optimizer.zero_grad(set_to_none=True)
    loss_of = loss_for(loss_fn).of
    by_count = count is not None and (len(batches) > 1 or total is not None)
    sizes: list[Size] = [count(y) for _, y in batches] if by_count and count is not None \
        else [len(y) for _, y in batches]
    n_batch: Size = sum(sizes) if total is None or not by_count else total
    total_loss = torch.zeros((), device=batches[0][0].device)
    for i, ((x, y), size) in enumerate(zip(batches, sizes)):
        with no_sync() if no_sync is not None and i < len(batches) - 1 else contextlib.nullcontext():
            with autocast(precision, x.device):
                loss = loss_of(model, x, y)
            loss = micro_batch_loss(loss, size, n_batch)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        if after_backward is not None:
            after_backward(i, size, n_batch)
        total_loss += loss.detach().float()
    if before_update is not None:
        before_update()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return total_loss
