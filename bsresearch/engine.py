"""One model trains: a single run's (and advise's) engine for the loop, its step and its evaluation.

`train_step` is one optimizer update of a TrainState on its next batch (bsresearch.step.training_step does
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
from .runtime import autocast
from .state import TrainState
from .step import training_step

CROSS_ENTROPY = loss_for("cross_entropy")


def train_step(state: TrainState, cfg: RunConfig, data: Data, lr: float, loss: Loss = CROSS_ENTROPY,
               hooks: StepHooks | None = None) -> torch.Tensor:
    """One optimizer update (step.training_step) on the state's next batch (cfg.batch_size examples, or the
    batch schedule's size at this step); returns the batch's mean loss (a tensor, not synchronised).

    With micro_batch_size the batch is split and gradients accumulate (each micro-batch's loss weighted by
    its share); `hooks` run after each micro-batch's backward pass and before the update.
    """
    x, y = state.next_batch(data)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
        if "betas" in group:   # Adam's beta2 follows the batch size where beta2_scaling asks (a batch schedule)
            group["betas"] = (group["betas"][0], schedule.adam_beta2_at(cfg, len(y)))
    batches = list(zip(x.split(cfg.micro_batch_size), y.split(cfg.micro_batch_size))) if cfg.micro_batch_size \
        else [(x, y)]
    value = training_step(state.model, state.optimizer, batches, cfg.precision, state.scaler, loss,
                          after_backward=hooks.after_backward if hooks else None,
                          before_update=hooks.before_update if hooks else None)
    state.step += 1
    state.examples_seen += len(y)
    return value


@torch.no_grad()
def evaluate_batches(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                     loss: Loss = CROSS_ENTROPY, precision: str = "fp32",
                     accuracy: bool = True) -> tuple[float, float | None]:
    """(mean loss over the examples, accuracy or None) of `model` over `batches`, in eval mode (BatchNorm
    running statistics); accuracy counts every target (every token of a sequence). The model's mode is
    restored afterwards."""
    was_training = model.training
    model.eval()
    loss_sum: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    examples = targets = 0
    for xb, yb in batches:
        with autocast(precision, xb.device):
            output = model(xb)
        total = loss.total(output, yb)
        loss_sum = total if loss_sum is None else loss_sum + total
        if accuracy:
            hits = (output.argmax(-1) == yb).sum()
            correct = hits if correct is None else correct + hits
            targets += yb.numel()
        examples += len(yb)
    model.train(was_training)
    if loss_sum is None:
        return math.nan, (math.nan if accuracy else None)
    return loss_sum.item() / examples, (correct.item() / targets if correct is not None else None)


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
    TrainState's model, optimizer and GradScaler, stepped by train_step."""
    can_split = False

    def __init__(self, data: Data, loss: Loss, task: Task) -> None:
        self.data, self.loss, self.task = data, loss, task

    def step(self, members: list[Member], lrs: list[float], hooks: list[StepHooks | None]) -> torch.Tensor:
        return torch.stack([train_step(m.state, m.cfg, self.data, lr, self.loss, h).reshape(())
                            for m, lr, h in zip(members, lrs, hooks)])

    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        chunk = eval_chunk_size(self.task.tokens_per_example)
        return [evaluate_batches(m.state.model, self.data.eval_batches(split, limit, chunk), self.loss,
                                 m.cfg.precision, self.task.accuracy) for m in members]

    def weight_stats(self, members: list[Member]) -> list[tuple[float, float]]:
        return [weight_stats(m.state) for m in members]

    def remove(self, members: list[Member]) -> None:
        pass  # each member's TrainState is already its own
