"""A user's dataset factory, given as a reference in RunConfig.dataset, turned into a train and a test split.

The factory is called with the config's dataset_kwargs and returns one dataset (the toolkit holds out a
seeded test split of test_size) or a pair (train, test). Each dataset is a map-style torch Dataset whose
items are (input, target), a TensorDataset of two tensors, or a pair of tensors (inputs, targets).
Attributes the toolkit reads from the training dataset when it has them: num_classes (a built-in model
on your data), characters_per_token or bytes_per_token (a language model's loss in bits per character
or byte).

Nothing here decides how the data is served: data.py keeps tensors resident on the device or streams
a Dataset through torch's DataLoader.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import default_collate as collate

from .config import ConfigError, RunConfig
from .loading import call_factory, load_factory
from .runtime import make_generator

ATTRIBUTES = ("num_classes", "characters_per_token", "bytes_per_token")  # read from the training dataset


@dataclass(frozen=True)
class Split:
    """One split of a user's data: tensors (x, y) when it came as tensors, else a map-style Dataset."""
    tensors: tuple[torch.Tensor, torch.Tensor] | None
    dataset: TorchDataset | None

    def __len__(self) -> int:
        return len(self.tensors[0]) if self.tensors is not None else len(self.dataset)  # type: ignore[arg-type]

    def as_dataset(self) -> TorchDataset:
        """A map-style Dataset view (tensors as a TensorDataset)."""
        if self.tensors is not None:
            return TensorDataset(*self.tensors)
        assert self.dataset is not None
        return self.dataset

    def subset(self, index: torch.Tensor) -> Split:
        if self.tensors is not None:
            return Split((self.tensors[0][index], self.tensors[1][index]), None)
        return Split(None, Subset(self.dataset, index.tolist()))  # type: ignore[arg-type]

    def materialize(self, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) stacked from every item, as the DataLoader's default collate stacks a batch."""
        if self.tensors is not None:
            return self.tensors
        return as_pair(collate([self.dataset[i] for i in range(len(self))]), what)  # type: ignore[index]


def as_pair(item: Any, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A collated (input, target) as two tensors, or ConfigError saying what the item was."""
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(t, torch.Tensor) for t in item):
        return item[0], item[1]
    shape = f"a {type(item).__name__}" + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
    raise ConfigError(f"{what}: items must be (input, target) pairs of tensors or numbers; an item is {shape}")


def _is_tensor_pair(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(t, torch.Tensor) for t in value)


def _split(value: Any, what: str) -> Split:
    """One dataset as a Split, checking its first item (a DataLoader stands for its dataset)."""
    if isinstance(value, DataLoader) and not isinstance(value.dataset, IterableDataset):
        return _split(value.dataset, what)
    if _is_tensor_pair(value):
        x, y = value
        if len(x) != len(y):
            raise ConfigError(f"{what}: inputs have {len(x)} examples but targets {len(y)}")
        return Split((x, y), None)
    if isinstance(value, TensorDataset):
        if len(value.tensors) != 2:
            raise ConfigError(f"{what}: a TensorDataset of (inputs, targets) needs 2 tensors; it has "
                              f"{len(value.tensors)}")
        return Split((value.tensors[0], value.tensors[1]), None)
    if isinstance(value, IterableDataset) or not isinstance(value, TorchDataset) or not hasattr(value, "__len__"):
        kind = "an IterableDataset (it has no length or indexing)" if isinstance(value, IterableDataset) else \
            f"a {type(value).__name__}"
        raise ConfigError(f"{what} must be a map-style torch Dataset of (input, target) items, a TensorDataset or "
                          f"a pair of tensors (inputs, targets); got {kind}")
    if len(value) < 1:
        raise ConfigError(f"{what} is empty")
    try:
        first = value[0]
    except Exception as exc:  # noqa: BLE001 - the user's __getitem__ failing is their message
        raise ConfigError(f"{what}: reading item 0 raised {type(exc).__name__}: {exc}") from None
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        shape = f"a {type(first).__name__}" + (f" of {len(first)}" if isinstance(first, (tuple, list)) else "")
        raise ConfigError(f"{what}: items must be (input, target) pairs; item 0 is {shape}")
    if not all(isinstance(t, (torch.Tensor, np.ndarray, int, float)) for t in first):
        raise ConfigError(f"{what}: items must be (input, target) of tensors or numbers; item 0 holds "
                          f"{type(first[0]).__name__} and {type(first[1]).__name__}")
    return Split(None, value)


@dataclass(frozen=True)
class UserData:
    """A user's data: the train and test splits, and the attributes of the training dataset (ATTRIBUTES)."""
    train: Split
    test: Split
    attributes: Mapping[str, Any]
    held_out: bool                 # the test split was held out of one dataset by the toolkit


def load_user_data(cfg: RunConfig) -> UserData:
    """Call the config's dataset factory and split what it returns (module docstring)."""
    factory = load_factory(cfg.dataset, "dataset")
    made = call_factory(factory, cfg.dataset_kwargs, "dataset factory", cfg.dataset, "dataset_kwargs")
    what = f"dataset {cfg.dataset}"
    if isinstance(made, (tuple, list)) and len(made) == 2 and not _is_tensor_pair(made):
        train, test = _split(made[0], f"{what} (train)"), _split(made[1], f"{what} (test)")
        source, held_out = made[0], False
    else:
        whole, source, held_out = _split(made, what), made, True
        n = len(whole)
        n_test = round(cfg.test_size * n) if cfg.test_size < 1 else int(cfg.test_size)
        if not 1 <= n_test < n:
            raise ConfigError(f"test_size {cfg.test_size:g} holds out {n_test} of the {n} examples of {what}; "
                              f"it must leave at least one for each split")
        order = torch.randperm(n, generator=make_generator(0, f"holdout:{cfg.dataset}"))  # the same for every seed
        train, test = whole.subset(order[n_test:]), whole.subset(order[:n_test])
    attributes = {name: getattr(source, name) for name in ATTRIBUTES if hasattr(source, name)}
    if cfg.train_size is not None:
        if cfg.train_size > len(train):
            raise ConfigError(f"train_size {cfg.train_size} exceeds the {len(train)} training examples of {what}")
        keep = torch.randperm(len(train), generator=make_generator(0, f"subset:{cfg.dataset}"))[:cfg.train_size]
        train = train.subset(keep)
    return UserData(train, test, attributes, held_out)


def first_examples(data: Any, max_examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): the first max_examples examples of `data`, stacked along the first dimension.

    data: a pair of tensors (x, y) with len(x) == len(y); a map-style Dataset of (input, target) items
    (read in index order 0, 1, 2, ...); a DataLoader over one (its dataset read in order with its
    collate_fn, so no shuffling or global random draws happen here); or a DataLoader over an
    IterableDataset (its batches, in the order it yields them; the global RNG state is kept). The tensors
    stay where they are.
    """
    if max_examples < 2:
        raise ConfigError(f"max_examples must be at least 2; got {max_examples}")
    if isinstance(data, DataLoader) and isinstance(data.dataset, IterableDataset):
        xs, ys, count = [], [], 0
        with torch.random.fork_rng(devices=[]):  # iterating draws its base seed from the global RNG
            for batch in data:
                bx, by = as_pair(batch, "data: the DataLoader")
                xs.append(bx)
                ys.append(by)
                count += len(bx)
                if count >= max_examples:
                    break
        if not xs:
            raise ConfigError("data: the DataLoader yielded no batches")
        return torch.cat(xs)[:max_examples], torch.cat(ys)[:max_examples]
    collate_fn = data.collate_fn if isinstance(data, DataLoader) else collate
    if not (_is_tensor_pair(data) or isinstance(data, (DataLoader, TorchDataset))):
        raise ConfigError(f"data must be a torch Dataset, a DataLoader or a pair of tensors (inputs, targets); "
                          f"got a {type(data).__name__}")
    split = _split(data, "data")
    if split.tensors is not None:
        x, y = split.tensors
        return x[:max_examples], y[:max_examples]
    n = min(len(split), max_examples)
    if n < 2:
        raise ConfigError(f"data has {len(split)} examples; at least 2 are needed")
    return as_pair(collate_fn([split.dataset[i] for i in range(n)]), "data")  # type: ignore[index]
