"""One model trains: a single run's (and advise's) engine for the loop, its step and its evaluation.

`train_next_batch` is one optimizer update of a TrainState on its next batch (bsresearch.step.optimizer_update does
the arithmetic); `evaluate_batches` is the mean loss (and accuracy where the task has it) over batches in
eval mode; `ModelEngine` runs a member of the loop with them.

Conventions (docs/design.md#conventions): batch size = examples per optimizer update; micro-batches only
split the work (gradient accumulation); the loss is a mean over the batch; the learning rate of every step
comes from the loop (schedule.lr_at).
"""
from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn as nn

from . import schedule
from .config import RunConfig
from .data import EVAL_CHUNK, Data, eval_chunk_size, in_chunks
from .loop import Member, StepHooks
from .losses import Loss, Task, loss_for
from .model_io import IGNORE_INDEX, Inputs, call, logits_of
from .runtime import autocast
from .state import TrainState
from .step import optimizer_update

CROSS_ENTROPY = loss_for("cross_entropy")


def prepare_update(optimizer: torch.optim.Optimizer, cfg: RunConfig, lr: float, x: Inputs, y: torch.Tensor,
                   devices: int = 1) -> list[tuple[Inputs, torch.Tensor]]:
    """Ready `optimizer` for one update of a batch of len(y) * `devices` examples, of which (x, y) is this
    process's share (all of it on one device): every parameter group's lr, and Adam's beta2 for the batch's
    size where beta2_scaling asks (schedule.adam_beta2_at: a batch schedule changes it). Returns the share
    split into its micro-batches of micro_batch_size / `devices` examples (one per accumulation step), or the
    share itself without accumulation. The one place a step is prepared: train_next_batch and, on several
    devices, devices.engine.DeviceEngine."""
    for group in optimizer.param_groups:
        group["lr"] = lr
        if "betas" in group:
            group["betas"] = (group["betas"][0], schedule.adam_beta2_at(cfg, len(y) * devices))
    if not cfg.micro_batch_size:
        return [(x, y)]
    part = cfg.micro_batch_size // devices
    return list(zip(x.split(part), y.split(part)))


def train_next_batch(state: TrainState, cfg: RunConfig, data: Data, lr: float, loss: Loss = CROSS_ENTROPY,
                     hooks: StepHooks | None = None, task: Task | None = None) -> torch.Tensor:
    """One optimizer update (step.optimizer_update) on the state's next batch (cfg.batch_size examples, or the
    batch schedule's size at this step); returns the batch's mean loss (a tensor, not synchronised).

    With micro_batch_size the batch is split and gradients accumulate (each micro-batch's loss weighted by
    its share: of the batch's real tokens when `task` is token-level); `hooks` run after each micro-batch's
    backward pass and before the update.
    """
    x, y = state.next_batch(data)
    batches = prepare_update(state.optimizer, cfg, lr, x, y)
    value = optimizer_update(state.model, state.optimizer, batches, cfg.precision, state.scaler, loss,
                          after_backward=hooks.after_backward if hooks else None,
                          before_update=hooks.before_update if hooks else None,
                          count=task.count if task is not None and task.token_level else None)
    state.step += 1
    state.examples_seen += len(y)
    return value


class EvalSums:
    """The sums an evaluation accumulates over batches, and the mean loss and accuracy they give: the one
    place this arithmetic is written (evaluate_batches; a fused group's evaluation, one per member).

    The loss is summed per example (Loss.total) and divided by the examples; with a token-level `task` the
    sum over real tokens is kept too and, where some target is -100 (padding), the mean is over the real
    tokens of all the batches and accuracy counts those only. Where every target is real, the numbers are the
    example mean's, bit for bit."""

    def __init__(self, loss: Loss, accuracy: bool, task: Task | None = None):
        self.loss, self.accuracy, self.task = loss, accuracy, task
        self.tokens = task is not None and task.token_level
        self.loss_sum: torch.Tensor | None = None
        self.token_sum: torch.Tensor | None = None
        self.correct: torch.Tensor | None = None
        self.real: torch.Tensor | int = 0
        self.examples = self.targets = self.counted = 0   # counted: the targets the loss would count unpadded

    def add(self, output: object, yb: torch.Tensor) -> None:
        total = self.loss.total(output, yb)
        self.loss_sum = total if self.loss_sum is None else self.loss_sum + total
        if self.tokens:
            assert self.task is not None
            count = self.task.count(yb)
            part = self.loss.token_total(output, yb, count)
            self.token_sum = part if self.token_sum is None else self.token_sum + part
            self.real = self.real + count
            self.counted += yb[:, self.task.label_shift:].numel()
        if self.accuracy:
            hits = logits_of(output).argmax(-1) == yb
            hits = (hits & (yb != IGNORE_INDEX)).sum() if self.tokens else hits.sum()
            self.correct = hits if self.correct is None else self.correct + hits
            self.targets += yb.numel()
        self.examples += len(yb)

    def result(self) -> tuple[float, float | None]:
        if self.loss_sum is None:
            return math.nan, (math.nan if self.accuracy else None)
        if self.tokens:
            assert self.task is not None and self.token_sum is not None
            real = int(self.real)
            if real != self.counted:   # some target is padding
                return self.token_sum.item() / real, (self.correct.item() / real if self.correct is not None
                                                      else None)
        return self.loss_sum.item() / self.examples, (self.correct.item() / self.targets
                                                      if self.correct is not None else None)


@torch.no_grad()
def evaluate_batches(model: nn.Module, batches: Iterable[tuple[Inputs, torch.Tensor]],
                     loss: Loss = CROSS_ENTROPY, precision: str = "fp32",
                     accuracy: bool = True, task: Task | None = None) -> tuple[float, float | None]:
    """(mean loss over the examples, accuracy or None) of `model` over `batches`, in eval mode (BatchNorm
    running statistics); accuracy counts every target (every token of a sequence). The model's mode is
    restored afterwards. A token-level `task` averages over real tokens (EvalSums)."""
    was_training = model.training
    model.eval()
    sums = EvalSums(loss, accuracy, task)
    for xb, yb in batches:
        with autocast(precision, xb.device):
            output = call(model, xb, yb if loss.from_model else None)
        sums.add(output, yb)
    model.train(was_training)
    return sums.result()


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
             chunk_size: int = EVAL_CHUNK, loss: Loss = CROSS_ENTROPY) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of a classifier on tensors (x, y), in eval mode, chunk by chunk."""
    value, accuracy = evaluate_batches(model, in_chunks(x, y, chunk_size), loss, precision)
    return value, float(accuracy)  # type: ignore[arg-type]


@torch.no_grad()
def weight_stats(state: TrainState) -> tuple[float, float]:
    """(L2 distance from the initial weights, L2 norm of the weights), over all parameters."""
    params = [p.detach().float() for p in state.model.parameters()]
    distance = sum(((p - p0.float()) ** 2).sum() for p, p0 in zip(params, state.initial_params))
    norm = sum((p ** 2).sum() for p in params)
    return math.sqrt(float(distance)), math.sqrt(float(norm))


class ModelEngine:
    """The loop's engine for members that each train their own nn.Module (in practice one member): their
    TrainState's model, optimizer and GradScaler, stepped by train_next_batch."""
    can_split = False

    def __init__(self, data: Data, loss: Loss, task: Task) -> None:
        self.data, self.loss, self.task = data, loss, task

    def step(self, members: list[Member], lrs: list[float], hooks: list[StepHooks | None]) -> torch.Tensor:
        return torch.stack([train_next_batch(m.state, m.cfg, self.data, lr, self.loss, h, self.task).reshape(())
                            for m, lr, h in zip(members, lrs, hooks)])

    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        chunk = eval_chunk_size(self.task.tokens_per_example)
        return [evaluate_batches(m.state.model, self.data.eval_batches(split, limit, chunk), self.loss,
                                 m.cfg.precision, self.task.accuracy, self.task) for m in members]

    def weight_stats(self, members: list[Member]) -> list[tuple[float, float]]:
        return [weight_stats(m.state) for m in members]

    def remove(self, members: list[Member]) -> None:
        pass  # each member's TrainState is already its own
