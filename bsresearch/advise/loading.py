"""What `advise` accepts from a user, turned into what it measures with: FILE_OR_MODULE:NAME references,
data as (inputs, targets) tensors, and losses by name.

Every mistake here is a ConfigError naming the problem and what is accepted, raised before any work.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data import default_collate as collate

from ..config import ConfigError

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output, targets) -> mean loss, a scalar


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy with the classes in the last dimension of logits: (batch, classes) for a
    classifier, (batch, seq_len, vocab) with targets (batch, seq_len) for a language model (mean over tokens)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# name -> a mean-reduced loss; every one returns the mean over examples (and tokens)
LOSSES: dict[str, LossFn] = {"cross_entropy": token_cross_entropy, "mse": F.mse_loss, "l1": F.l1_loss,
                             "smooth_l1": F.smooth_l1_loss, "bce_with_logits": F.binary_cross_entropy_with_logits}


def load_object(reference: str, what: str) -> Any:
    """The object named by 'path/to/file.py:NAME' or 'package.module:NAME'.

    `what` names the option in messages ('model', 'data', 'loss'). A missing file, a module that cannot
    be imported or a missing name is a ConfigError.
    """
    source, sep, name = str(reference).rpartition(":")
    if not sep or not source or not name:
        raise ConfigError(f"{what} must be FILE_OR_MODULE:NAME (e.g. examples/tiny_transformer.py:make_model "
                          f"or mypackage.models:make_model); got {reference!r}")
    if source.endswith(".py") or "/" in source or "\\" in source:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"{what} file {source!r} does not exist")
        module_name = f"_bsresearch_user_{path.stem}_{abs(hash(str(path.resolve())))}"
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            if spec is None or spec.loader is None:
                raise ConfigError(f"{what} file {source!r} is not a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
    else:
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"{what} module {source!r} cannot be imported ({exc}); give a module on "
                              f"PYTHONPATH or a path to a .py file") from None
    if not hasattr(module, name):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"{what}: {source!r} has no {name!r}; it defines {', '.join(public) or 'nothing callable'}")
    return getattr(module, name)


def load_factory(reference: str, what: str) -> Callable[..., Any]:
    """load_object, which must be callable (a factory called with no arguments)."""
    factory = load_object(reference, what)
    if not callable(factory):
        raise ConfigError(f"{what}: {reference!r} is a {type(factory).__name__}, not a function to call")
    return factory


def resolve_loss(loss: str | LossFn) -> LossFn:
    """A loss function from a name in LOSSES, a FILE_OR_MODULE:FUNC reference, or a callable."""
    if callable(loss):
        return loss
    if loss in LOSSES:
        return LOSSES[loss]
    if ":" in str(loss):
        return load_factory(str(loss), "loss")
    raise ConfigError(f"loss must be one of {', '.join(LOSSES)} or FILE_OR_MODULE:FUNC; got {loss!r}")


def check_model(model: Any, source: str = "model_fn") -> nn.Module:
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{source} must return a torch.nn.Module; it returned a {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{source} returned a {type(model).__name__} with no trainable parameters")
    return model


def _pair(item: Any, source: str) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(item, (tuple, list)) and len(item) == 2
            and all(isinstance(t, torch.Tensor) for t in item)):
        raise ConfigError(f"data must give (input, target) pairs of tensors; {source} gave a "
                          f"{type(item).__name__}" + (f" of {len(item)}" if isinstance(item, (tuple, list)) else ""))
    return item[0], item[1]


def data_tensors(data: Any, max_examples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), the first max_examples examples of `data`, stacked along the first dimension.

    data: a pair of tensors (x, y) with len(x) == len(y); a map-style Dataset of (input, target) items
    (read in index order 0, 1, 2, ...); a DataLoader over one (its dataset read in order with its
    collate_fn, so no shuffling or global random draws happen here); or a DataLoader over an
    IterableDataset (its batches, in the order it yields them; the global RNG state is kept). The tensors
    stay where they are.
    """
    if max_examples < 2:
        raise ConfigError(f"max_examples must be at least 2; got {max_examples}")
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
        if len(x) != len(y):
            raise ConfigError(f"data: inputs have {len(x)} examples but targets {len(y)}")
        return x[:max_examples], y[:max_examples]
    if isinstance(data, DataLoader):
        if isinstance(data.dataset, IterableDataset):
            xs, ys, count = [], [], 0
            # iterating a DataLoader draws its base seed from the global RNG: keep the caller's state
            with torch.random.fork_rng(devices=[]):
                for batch in data:
                    bx, by = _pair(batch, "the DataLoader")
                    xs.append(bx)
                    ys.append(by)
                    count += len(bx)
                    if count >= max_examples:
                        break
            if not xs:
                raise ConfigError("data: the DataLoader yielded no batches")
            return torch.cat(xs)[:max_examples], torch.cat(ys)[:max_examples]
        return _from_dataset(data.dataset, max_examples, data.collate_fn)
    if isinstance(data, Dataset) and hasattr(data, "__len__"):
        return _from_dataset(data, max_examples, collate)
    raise ConfigError(f"data must be a torch Dataset, a DataLoader or a pair of tensors (inputs, targets); "
                      f"got a {type(data).__name__}")


def _from_dataset(dataset: Any, max_examples: int, collate_fn: Callable[[list[Any]], Any]) -> tuple[torch.Tensor,
                                                                                                    torch.Tensor]:
    n = min(len(dataset), max_examples)
    if n < 2:
        raise ConfigError(f"data has {len(dataset)} examples; advise needs at least 2")
    return _pair(collate_fn([dataset[i] for i in range(n)]), "the dataset")
