"""Losses by name, a user's loss by reference, and what the targets make of a run (its task).

Every loss is a mean over the batch (and over a sequence's tokens): `loss(output, target)` returns a
scalar. cross_entropy takes the classes in the last dimension of the output, so it serves a classifier,
(batch, classes) with targets (batch,), and a language model, (batch, sequence, vocabulary) with targets
(batch, sequence), alike.

The task follows from the output and the targets, never from the model's name: targets of integer class
indices with one more output dimension (the classes) give accuracy; a sequence of them is a language
model's tokens, whose loss is in nats per token (and bits per character or byte when the dataset says
how many characters or bytes a token holds); anything else reports its loss alone.

`loss: model` is the loss a model computes itself from the batch's labels (a Hugging Face model's `loss`).
A token-level loss (cross_entropy on a sequence, or the model's own) ignores targets of -100 (padding) and
is the mean over the real tokens of the whole batch: `Task.count` says how many targets a batch's loss
averages over, which the accumulation rule (step.micro_batch_loss) and evaluation weight by.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from . import config as C
from .config import ConfigError
from .loading import load_factory
from .model_io import IGNORE_INDEX, Inputs, call, logits_of, model_loss_of

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output, targets) -> mean loss, a scalar


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy with the classes in the last dimension: (batch, classes) with targets (batch,), or
    (batch, sequence, vocabulary) with targets (batch, sequence), the mean over every token."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def model_loss(output: object, target: torch.Tensor) -> torch.Tensor:
    """`loss: model`: the loss the model computed from the labels it was given (batch.model_loss_of)."""
    return model_loss_of(output)


# name -> a mean-reduced loss (the names are config.LOSSES)
LOSSES: dict[str, LossFn] = {"cross_entropy": cross_entropy, "mse": F.mse_loss, "l1": F.l1_loss,
                             "smooth_l1": F.smooth_l1_loss, "bce_with_logits": F.binary_cross_entropy_with_logits,
                             "model": model_loss}
UNITS = {"cross_entropy": "nats", "mse": "mean squared error", "l1": "mean absolute error",
         "smooth_l1": "smooth L1 loss", "bce_with_logits": "binary cross-entropy (nats)", "model": "the model's loss"}
TOKEN_LOSSES = ("cross_entropy", "model")  # on a sequence: a mean over the real tokens (targets other than -100)


@dataclass(frozen=True)
class Loss:
    """A mean-reduced loss and its name (a built-in name, a reference, or the callable's name). It takes a
    model's output as the model gives it (batch.logits_of reads it; `model` takes the model's own loss)."""
    name: str
    fn: LossFn

    @property
    def from_model(self) -> bool:
        """The model computes this loss itself, from the labels it is given."""
        return self.name == "model"

    def __call__(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        return self.fn(output if self.from_model else logits_of(output), target)

    def of(self, model: torch.nn.Module, x: Inputs, y: torch.Tensor,
           params: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        """The loss of `model` (with `params`, by torch.func.functional_call) on the batch (x, y): the one way
        every path runs a model into its loss (batch.call feeds it; the labels go in for `model`)."""
        return self(call(model, x, y if self.from_model else None, params), y)

    def total(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        """The sum over the examples of each example's mean loss, in float64 (evaluation sums these over
        chunks and divides by the number of examples, which gives the mean over the whole set)."""
        output = output if self.from_model else logits_of(output)
        if self.name == "cross_entropy":  # summed in one kernel: the numbers the toolkit has always reported
            per_example = target[0].numel() if target.dim() > 1 else 1
            total = F.cross_entropy(output.float().reshape(-1, output.shape[-1]), target.reshape(-1),
                                    reduction="sum").double()
            return total / per_example if per_example > 1 else total
        if self.from_model:
            return self.fn(output, target).double() * len(target)
        return self.fn(output.float(), target).double() * len(target)

    def token_total(self, output: Any, target: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """The sum of a token-level loss over the `count` real tokens of a batch, in float64."""
        if self.name == "cross_entropy":
            logits = logits_of(output)
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1),
                                   reduction="sum").double()
        return self(output, target).double() * count


def loss_for(loss: str | LossFn) -> Loss:
    """A Loss from a name in LOSSES, a FILE_OR_MODULE:FUNC reference, or a callable."""
    if isinstance(loss, Loss):
        return loss
    if callable(loss):
        return Loss(getattr(loss, "__name__", "loss_fn"), loss)
    if loss in LOSSES:
        return Loss(loss, LOSSES[loss])
    if C.is_reference(str(loss)):
        return Loss(str(loss), load_factory(str(loss), "loss"))
    raise ConfigError(f"loss must be one of {', '.join(LOSSES)} or FILE_OR_MODULE:FUNC; got {loss!r}")


@dataclass(frozen=True)
class Task:
    """What the targets make of a run: whether accuracy applies, tokens per example, the loss's units."""
    kind: str                     # classification | sequence (a language model's tokens) | regression
    accuracy: bool                # targets are class indices: accuracy is reported
    tokens_per_example: int       # a sequence's length for a language model, else 1
    loss_unit: str                # e.g. "nats per token", "nats", "mean squared error"
    text_unit: str | None = None  # "character" or "byte" when the dataset says how many a token holds
    units_per_token: float = 1.0
    token_level: bool = False     # the loss is a mean over a sequence's real tokens (targets other than -100)
    label_shift: int = 0          # the leading positions of each sequence the loss skips (a causal LM's shift: 1)

    def count(self, target: torch.Tensor) -> torch.Tensor:
        """How many targets of a batch its token-level loss averages over (a 0-d tensor, not synchronised):
        those other than -100, after the first `label_shift` positions of each sequence."""
        kept = target[:, self.label_shift:] if self.label_shift else target
        return (kept != IGNORE_INDEX).sum()

    @property
    def bits_column(self) -> str | None:
        """The history's bits-per-unit column suffix ('bits_per_character'), or None."""
        return f"bits_per_{self.text_unit}" if self.text_unit else None

    def bits(self, loss_nats_per_token: float) -> float:
        """Loss in nats per token as bits per character (or byte)."""
        return loss_nats_per_token / math.log(2) / self.units_per_token

    def describe(self) -> dict[str, Any]:
        """For config.json's derived values."""
        return {"task": self.kind, "accuracy": self.accuracy, "tokens_per_example": self.tokens_per_example,
                "loss_unit": self.loss_unit, **({"bits_unit": f"bits per {self.text_unit}"} if self.text_unit else {}),
                **({"label_shift": self.label_shift} if self.label_shift else {})}


TEXT_UNITS = ("character", "byte")  # a dataset may say `characters_per_token` or `bytes_per_token`


def class_indices(output: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether `target` holds class indices for `output`'s scores: integer targets, and an output with one
    more dimension (the classes) than the targets."""
    is_index = not target.is_floating_point() and not target.is_complex() and target.dtype != torch.bool
    return is_index and output.is_floating_point() and tuple(output.shape[:-1]) == tuple(target.shape)


def task_of(loss: Loss, output: torch.Tensor, target: torch.Tensor,
            attributes: Mapping[str, Any] | None = None, label_shift: int = 0) -> Task:
    """The task of a run whose model gives `output` (its logits) for a batch whose targets are `target` (see the
    module docstring). `attributes` (what the user's training dataset says of itself) may hold
    characters_per_token or bytes_per_token. `label_shift`: the positions the model's own loss skips (the dry
    run finds it). With `loss: model` a sequence's tokens have no accuracy: the model may shift its labels."""
    classes = class_indices(output, target)
    sequence = classes and target.dim() >= 2
    unit = UNITS.get(loss.name, f"loss ({loss.name})")
    if loss.name in TOKEN_LOSSES and sequence:
        unit = "nats per token"
    text_unit, per_token = None, 1.0
    if sequence:
        for name in TEXT_UNITS:
            value = (attributes or {}).get(f"{name}s_per_token")
            if value is not None:
                if not (isinstance(value, (int, float)) and value > 0):
                    raise ConfigError(f"dataset: {name}s_per_token must be a positive number; got {value!r}")
                text_unit, per_token = name, float(value)
                break
    return Task(kind="sequence" if sequence else "classification" if classes else "regression",
                accuracy=bool(classes) and not (sequence and loss.from_model),
                tokens_per_example=int(target[0].numel()) if sequence else 1,
                loss_unit=unit, text_unit=text_unit, units_per_token=per_token,
                token_level=sequence and loss.name in TOKEN_LOSSES, label_shift=label_shift if sequence else 0)
