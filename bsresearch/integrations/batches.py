"""What a framework-free meter needs to know of a trainer's batch: how many examples and real tokens it holds, a
part of it, and a fixed probe batch drawn from the training data. A batch is anything a trainer feeds its model:
a tensor, a tuple or list of tensors, or a mapping of named tensors (a Hugging Face batch); examples are along
the first dimension of its tensors."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..config import ConfigError

IGNORE_INDEX = -100   # the label torch's cross-entropy and Hugging Face's losses skip (padding, prompts)


@dataclass(frozen=True)
class Units:
    """A batch's size: examples, and the real tokens its loss averages over (None where the loss is per
    example). The noise scale of a token-level loss is in tokens, else in examples."""
    examples: int
    tokens: int | None = None

    @property
    def size(self) -> int:
        """The units the loss averages over: tokens where it is token-level, else examples."""
        return self.tokens if self.tokens is not None else self.examples


UnitsFn = Callable[[Any], Units]


def first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    for value in values:
        found = first_tensor(value)
        if found is not None:
            return found
    return None


def count_examples(batch: Any) -> int:
    tensor = first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        raise ConfigError(f"cannot count the examples of a batch of {type(batch).__name__}: pass units=, a "
                          f"function of the batch returning bsresearch.integrations.batches.Units")
    return int(tensor.shape[0])


def label_units(shift: bool) -> UnitsFn:
    """Units of a batch whose loss is the model's own over `labels` (Hugging Face): token-level where the labels
    are per position (2 or more dimensions): the labels other than IGNORE_INDEX, after the causal shift
    (`labels[..., 1:]`) when `shift`, or `shift_labels` where the batch has them; per example otherwise."""
    def units(batch: Any) -> Units:
        examples = count_examples(batch)
        labels = batch.get("shift_labels") if isinstance(batch, Mapping) else None
        shifted = labels is not None
        if labels is None and isinstance(batch, Mapping):
            labels = batch.get("labels")
        if not isinstance(labels, torch.Tensor) or labels.dim() < 2:
            return Units(examples)
        if shift and not shifted:
            labels = labels[..., 1:]
        return Units(examples, int(labels.ne(IGNORE_INDEX).sum()))
    return units


def part(batch: Any, stop: int) -> Any:
    """The first `stop` examples of a batch (every tensor with the batch's first dimension is cut; others kept)."""
    n = count_examples(batch)

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value[:stop] if value.dim() and value.shape[0] == n else value
        if isinstance(value, Mapping):
            return {k: cut(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(cut(v) for v in value)
        return value
    return cut(batch)


def probe_batch(loader: DataLoader, size: int, seed: int) -> Any:
    """`size` examples of the loader's dataset, drawn once without replacement by a generator seeded with `seed`
    and collated by the loader's own collate_fn: the same probe for every run of the same data and seed. Runs
    inside a forked RNG (a dataset's random transforms draw from the global streams)."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise ConfigError("the training data is an iterable dataset: the probe batch of the sharpness cannot be "
                          "drawn from it; pass probe=, a batch of your data, or sharpness_every=0")
    n = len(dataset)
    if size < 1:
        raise ConfigError(f"probe_size must be a positive number of examples; got {size}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:min(size, n)].tolist()
    collate = loader.collate_fn
    with torch.random.fork_rng(devices=[]):
        return collate([dataset[i] for i in order])


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def sizes(units: Sequence[Units]) -> list[int]:
    return [u.size for u in units]
