"""A user's dataset factory, given as a reference in RunConfig.dataset, turned into a train and a test split.

The factory is called with the config's dataset_kwargs and returns one dataset (the toolkit holds out a
seeded test split of test_size) or a pair (train, test). Each dataset is a map-style torch Dataset whose
items are (input, target) or mappings (their `labels` the targets, the rest the model's keyword inputs:
batch.split_batch), a TensorDataset of two tensors, a pair of tensors (inputs, targets), a DataLoader over one
(its collate_fn is kept), or a Hugging Face `datasets.Dataset` as it comes (its rows as tensors, text columns
left out). A `collate_fn` attribute of the training dataset (or a DataLoader's) builds every batch, e.g. a
Hugging Face collator that pads.
Attributes the toolkit reads from the training dataset when it has them: num_classes (a built-in model
on your data), characters_per_token or bytes_per_token (a language model's loss in bits per character
or byte).

Nothing here decides how the data is served: data.py keeps tensors resident on the device or streams
a Dataset through torch's DataLoader.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Subset, TensorDataset
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import default_collate as collate

from .config import ConfigError, RunConfig
from .loading import call_factory, load_factory
from .model_io import Features, Inputs, split_batch
from .runtime import make_generator

ATTRIBUTES = ("num_classes", "characters_per_token", "bytes_per_token")  # read from the training dataset


@dataclass(frozen=True)
class Split:
    """One split of a user's data: tensors (x, y) when it came as tensors, else a map-style Dataset and the
    function that collates its items into a batch."""
    tensors: tuple[torch.Tensor, torch.Tensor] | None
    dataset: TorchDataset | None
    collate_fn: Callable[[list[Any]], Any] = collate

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
        return Split(None, Subset(self.dataset, index.tolist()), self.collate_fn)  # type: ignore[arg-type]

    def materialize(self, what: str) -> tuple[Inputs, torch.Tensor]:
        """(inputs, targets) collated from every item at once, as the DataLoader collates a batch."""
        if self.tensors is not None:
            return self.tensors
        return collated(self.collate_fn, [self.dataset[i] for i in range(len(self))], what)  # type: ignore[index]


def as_pair(item: Any, what: str) -> tuple[Inputs, torch.Tensor]:
    """A collated batch as (inputs, targets) (batch.split_batch), or ConfigError saying what it was."""
    return split_batch(item, what)


def collated(collate_fn: Callable[[list[Any]], Any], items: list[Any], what: str) -> tuple[Inputs, torch.Tensor]:
    """collate_fn(items) as (inputs, targets); a collate_fn that raises is one ConfigError naming it."""
    try:
        batch = collate_fn(items)
    except Exception as exc:  # noqa: BLE001 - the user's collate_fn failing is their message, in one line
        name = getattr(collate_fn, "__name__", type(collate_fn).__name__)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"{what}: its collate_fn {name} raised {type(exc).__name__}"
                          f"{': ' + text if text else ''} on a batch of {len(items)} items") from None
    return as_pair(batch, what)


class RowsAsTensors(TorchDataset):
    """A Hugging Face `datasets.Dataset` (or any indexable of mapping rows) as a torch Dataset: each row's
    values as tensors, columns of text (or anything not numeric) left out."""

    def __init__(self, rows: Any):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        out = {}
        for key, value in self.rows[index].items():
            if isinstance(value, torch.Tensor):
                out[key] = value
            elif isinstance(value, (int, float, bool, np.ndarray, np.number)) or \
                    (isinstance(value, list) and _numeric(value)):
                out[key] = torch.as_tensor(value)
        return out

    def __getattr__(self, name: str) -> Any:   # what the toolkit reads of the wrapped dataset (ATTRIBUTES)
        if name not in (*ATTRIBUTES, "collate_fn"):   # not its batch reading (__getitems__): rows are read here
            raise AttributeError(name)
        return getattr(self.rows, name)


def _numeric(value: list) -> bool:
    while isinstance(value, list) and value:
        value = value[0]
    return isinstance(value, (int, float, bool, np.number)) or value == []


def _hf_rows(value: Any) -> bool:
    """A Hugging Face datasets.Dataset (by its interface: column_names, and rows by index), not a torch one."""
    return (not isinstance(value, TorchDataset) and hasattr(value, "column_names") and hasattr(value, "__len__")
            and hasattr(value, "__getitem__"))


def _is_tensor_pair(value: Any) -> bool:
    """(inputs, targets): a tensor or named tensors (batch.Features), and a tensor."""
    return isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], (torch.Tensor, Features)) \
        and isinstance(value[1], torch.Tensor)


def _split(value: Any, what: str, collate_fn: Callable[[list[Any]], Any] | None = None) -> Split:
    """One dataset as a Split, checking its first item (a DataLoader stands for its dataset, with its
    collate_fn; a `collate_fn` attribute of the dataset is used otherwise)."""
    if isinstance(value, DataLoader) and not isinstance(value.dataset, IterableDataset):
        return _split(value.dataset, what, value.collate_fn if value.collate_fn is not collate else collate_fn)
    if _hf_rows(value):
        value = RowsAsTensors(value)
    collate_fn = collate_fn or getattr(value, "collate_fn", None) or collate
    if _is_tensor_pair(value):
        x, y = value  # type: ignore[attr-defined]
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
    if isinstance(first, Mapping):
        collated(collate_fn, [first, value[min(1, len(value) - 1)]], what)  # the keys, and a collate_fn that runs
        return Split(None, value, collate_fn)
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        shape = f"a {type(first).__name__}" + (f" of {len(first)}" if isinstance(first, (tuple, list)) else "")
        raise ConfigError(f"{what}: items must be (input, target) pairs; item 0 is {shape} (or items may be "
                          f"mappings with 'labels')")
    if not all(isinstance(t, (torch.Tensor, np.ndarray, int, float)) for t in first):
        raise ConfigError(f"{what}: items must be (input, target) of tensors or numbers; item 0 holds "
                          f"{type(first[0]).__name__} and {type(first[1]).__name__}")
    if collate_fn is not collate:
        collated(collate_fn, [first, value[min(1, len(value) - 1)]], what)
    return Split(None, value, collate_fn)


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
        if test.tensors is None and test.collate_fn is collate:   # the training data's collate_fn serves both
            test = Split(None, test.dataset, train.collate_fn)
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


def first_examples(data: Any, max_examples: int) -> tuple[Inputs, torch.Tensor]:
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
        return torch.cat(xs)[:max_examples], torch.cat(ys)[:max_examples]  # type: ignore[arg-type]
    if not (_is_tensor_pair(data) or isinstance(data, (DataLoader, TorchDataset)) or _hf_rows(data)):
        raise ConfigError(f"data must be a torch Dataset, a DataLoader or a pair of tensors (inputs, targets); "
                          f"got a {type(data).__name__}")
    split = _split(data, "data")
    if split.tensors is not None:
        x, y = split.tensors
        return x[:max_examples], y[:max_examples]
    n = min(len(split), max_examples)
    if n < 2:
        raise ConfigError(f"data has {len(split)} examples; at least 2 are needed")
    return collated(split.collate_fn, [split.dataset[i] for i in range(n)], "data")  # type: ignore[index]
