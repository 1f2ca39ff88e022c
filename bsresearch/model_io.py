"""How a batch is fed to a model and what a model's output is: the one home of both, for every path that
runs a model (training, evaluation, the dry run, measurements, fused groups, benchmarks).

Inputs. A batch's inputs are one tensor, or named tensors (`Features`: what a mapping batch leaves once its
targets are taken out, as Hugging Face datasets and collators give, `input_ids`, `attention_mask`,
`pixel_values`...). A tensor goes in as `model(x)`, named tensors as keyword arguments, `model(**x)`.
Features behave as a tensor does along the batch dimension (len, indexing and slicing, split, to, device,
unsqueeze) and are a pytree node, so torch.func.vmap and the data paths take them as they take a tensor.

Targets. A mapping batch's targets are its `labels` (or `label`, a Hugging Face image dataset's column);
`loss: model` passes them back to the model as `labels=`. Targets equal to IGNORE_INDEX (-100, padding)
count for nothing in a token-level loss (losses.Task.count).

Outputs. A model may return a tensor, a tuple or list (its first element is the output), or a mapping such
as a Hugging Face ModelOutput (its `logits`); `logits_of` is the one adapter, `model_loss_of` takes the loss a
model computed itself.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.func import functional_call

from .config import ConfigError

IGNORE_INDEX = -100               # a target that counts for nothing (padding), as torch's cross-entropy has it
TARGET_KEYS = ("labels", "label")  # where a mapping batch keeps its targets


class OutputError(ValueError):
    """A model's output that the toolkit cannot read (no logits, no loss); the dry run turns it into a
    ConfigError naming the model."""


class Features:
    """Named tensors sharing their first (batch) dimension: a mapping batch's inputs. Indexing with a name
    gives that tensor; any other index (a slice, an index tensor, an int) indexes every tensor."""
    __slots__ = ("tensors",)

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        if not tensors:
            raise ConfigError("a mapping batch has no inputs besides its targets")
        self.tensors = dict(tensors)

    def __len__(self) -> int:
        return len(next(iter(self.tensors.values())))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            return self.tensors[index]
        return Features({k: v[index] for k, v in self.tensors.items()})

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def __repr__(self) -> str:
        return f"Features({describe(self)})"

    def keys(self) -> Any:
        return self.tensors.keys()

    def items(self) -> Any:
        return self.tensors.items()

    def values(self) -> Any:
        return self.tensors.values()

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Features:
        return Features({k: fn(v) for k, v in self.tensors.items()})

    def split(self, size: int) -> tuple[Features, ...]:
        parts = {k: v.split(size) for k, v in self.tensors.items()}
        return tuple(Features({k: p[i] for k, p in parts.items()}) for i in range(len(next(iter(parts.values())))))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Features:
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def unsqueeze(self, dim: int) -> Features:
        return self._map(lambda t: t.unsqueeze(dim))

    def pin_memory(self) -> Features:
        return self._map(lambda t: t.pin_memory())

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    @property
    def shape(self) -> torch.Size:
        """The batch dimension (what is common to every tensor)."""
        return torch.Size([len(self)])

    @property
    def nbytes(self) -> int:
        """The bytes of every tensor, as torch.Tensor.nbytes."""
        return sum(t.nbytes for t in self.tensors.values())


pytree.register_pytree_node(
    Features, lambda f: (list(f.tensors.values()), list(f.tensors)),
    lambda values, keys: Features(dict(zip(keys, values))), serialized_type_name="bsresearch.model_io.Features")

Inputs = torch.Tensor | Features


def describe(x: Any) -> str:
    """'(2, 5) float32', or 'input_ids (2, 8) int64, attention_mask (2, 8) int64' for named tensors."""
    if isinstance(x, Features):
        return ", ".join(f"{k} {describe(v)}" for k, v in x.items())
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}"
    return f"a {type(x).__name__}"


def split_batch(batch: Any, what: str) -> tuple[Inputs, torch.Tensor]:
    """A collated batch as (inputs, targets): an (input, target) pair of tensors, or a mapping whose `labels`
    (or `label`) are the targets and whose other tensors are the inputs (Features). ConfigError otherwise,
    naming what the batch holds."""
    if isinstance(batch, Mapping):
        key = next((k for k in TARGET_KEYS if k in batch), None)
        if key is None:
            raise ConfigError(f"{what}: a mapping batch needs its targets under 'labels' (or 'label'); its keys are "
                              f"{', '.join(map(str, batch)) or 'none'}")
        rest = {k: v for k, v in batch.items() if k not in TARGET_KEYS}
        odd = [k for k, v in {key: batch[key], **rest}.items() if not isinstance(v, torch.Tensor)]
        if odd:
            raise ConfigError(f"{what}: a mapping batch must hold tensors; {', '.join(map(str, odd))} "
                              f"{'is' if len(odd) == 1 else 'are'} not (keys: {', '.join(map(str, batch))})")
        return Features(rest), batch[key]
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        return batch[0], batch[1]
    shape = f"a {type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    raise ConfigError(f"{what}: items must be (input, target) pairs of tensors or numbers, or mappings with "
                      f"'labels'; an item is {shape}")


def call(model: nn.Module, x: Inputs, labels: torch.Tensor | None = None,
         params: Mapping[str, torch.Tensor] | None = None) -> Any:
    """The model's raw output on inputs `x`: `model(x)`, or `model(**x)` for named tensors; `labels` go in as
    `labels=` (a model that computes its own loss); with `params` (parameters and buffers by name) through
    torch.func.functional_call."""
    args: tuple[Any, ...] = (x,)
    kwargs: dict[str, Any] = {}
    if isinstance(x, Features):
        args, kwargs = (), dict(x.tensors)
    if labels is not None:
        kwargs["labels"] = labels
    if params is None:
        return model(*args, **kwargs)
    return functional_call(model, dict(params), args, kwargs)


def _kind(output: Any) -> str:
    return type(output).__name__


def logits_of(output: Any) -> torch.Tensor:
    """The output a loss and accuracy read: a tensor as it is; a tuple's or list's first element; a
    mapping's (a Hugging Face ModelOutput's) `logits`. OutputError for anything else."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        value = output.get("logits")
        if isinstance(value, torch.Tensor):
            return value
        held = ", ".join(map(str, output)) or "nothing"
        raise OutputError(f"returned a {_kind(output)} without logits (it holds {held}); the output must be a "
                          f"tensor, a tuple whose first element is one, or a mapping with "
                          f"'logits'")
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise OutputError(f"returned a {_kind(output)}; the output must be a tensor, a tuple whose first element is "
                      f"one, or a mapping with 'logits'")


def model_loss_of(output: Any) -> torch.Tensor:
    """The loss a model computed itself (`loss: model`): its output's `loss` (a mapping's or an attribute)."""
    value = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if not isinstance(value, torch.Tensor):
        raise OutputError(f"returned a {_kind(output)} with no loss; `loss: model` needs a model that computes its "
                          f"loss from the batch's labels (given as `labels=`) and returns it as `loss`")
    return value
