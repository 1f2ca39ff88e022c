"""TrainState: everything that changes while one run trains, and its checkpoint file.

A run's model, optimizer (and GradScaler), batch sampler, random generators, the step it has reached and
its history so far. A resumable checkpoint holds all of it, and beside it the state that the loop's
callbacks keep for the run (loop.Callback.key: the divergence reference, the noise-scale EMA), so a run
killed at any step continues exactly where it stopped (the same numbers as a run never stopped).
"""
from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from . import config as C
from . import schedule
from .config import ConfigError, RunConfig
from .data import BatchIndices, BatchSampler, Data
from .models import model_for
from .rundir import atomic_write_bytes
from .runtime import Generators, global_rng_state, is_out_of_memory
from .step import make_optimizer

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class TrainState:
    """Everything that changes during training; saved whole in a resumable checkpoint."""
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    sampler: BatchSampler
    generators: Generators
    initial_params: list[torch.Tensor]  # for the distance from initialisation
    indices: BatchIndices               # the sampler's batches, step by step (not saved: rebuilt on resume)
    step: int = 0                       # optimizer updates done
    examples_seen: int = 0
    train_seconds: float = 0.0          # time spent in training steps (evaluation excluded)
    history: list[dict[str, Any]] = field(default_factory=list)
    batches: Iterator[Batch] | None = field(default=None, repr=False)  # the data's batches of `indices`

    def next_batch(self, data: Data) -> Batch:
        """The training batch of the next step (the data serves the sampler's indices; see data.py)."""
        if self.batches is None:
            self.batches = iter(data.train_batches(self.indices))
        return next(self.batches)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "sampler": self.indices.sampler_state(self.step), "generators": self.generators.state_dict(),
                "initial_params": self.initial_params, "step": self.step, "examples_seen": self.examples_seen,
                "train_seconds": self.train_seconds, "history": self.history,
                # the global RNG the model draws from (runtime.model_randomness)
                "model_rng": global_rng_state(next(self.model.parameters()).device)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])
        self.sampler.load_state_dict(state["sampler"])
        self.generators.load_state_dict(state["generators"])
        device = next(self.model.parameters()).device
        self.initial_params = [p.to(device) for p in state["initial_params"]]
        self.step, self.examples_seen = int(state["step"]), int(state["examples_seen"])
        self.train_seconds = float(state["train_seconds"])
        self.history = list(state["history"])
        self.indices = BatchIndices(self.sampler, self.indices.size_at, self.step, self.indices.track)
        self.batches = None


def batch_schedule(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> Callable[[int], int]:
    """step -> the batch size of the update after it (schedule.batch_size_at): what BatchIndices draws."""
    return functools.partial(schedule.batch_size_at, cfg, n_train=n_train, tokens_per_example=tokens_per_example)


def new_state(cfg: RunConfig, data: Data, device: torch.device, model: nn.Module | None = None,
              optimizer: torch.optim.Optimizer | None = None) -> TrainState:
    """Fresh state for `cfg`: its model (models.model_for: weights from the 'init' generator only) unless one
    is given, the optimizer cfg names (or the one given, over that model), a sampler of the data. A schedule
    in tokens needs the task's tokens per example: train.run sets `indices.size_at` once the task is known."""
    gens = Generators.from_seed(cfg.seed, device)
    model = (model if model is not None else model_for(cfg, data, gens.init)).to(device)
    scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
    sampler = BatchSampler(data.n_train, cfg.batch_size, gens.data, replacement=cfg.sampling == "replacement")
    n_train = data.n_train
    indices = BatchIndices(sampler, batch_schedule(cfg, n_train), 0, track=not data.resident)
    return TrainState(model=model, optimizer=optimizer or make_optimizer(cfg, model), scaler=scaler,
                      sampler=sampler, generators=gens, indices=indices,
                      initial_params=[p.detach().clone() for p in model.parameters()])


def save_checkpoint(path: Path, cfg: RunConfig, state: TrainState, resumable: bool,
                    callbacks: dict[str, Any] | None = None) -> None:
    """Atomically save the whole TrainState and the callbacks' states for this run (loop.Loop.save; by
    callback key), so a rerun continues exactly where it stopped (resumable)."""
    buffer = io.BytesIO()
    torch.save({"config": cfg.to_dict(), "run_id": C.run_id(cfg), "resumable": resumable,
                "state": state.state_dict(), "callbacks": dict(callbacks or {})}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def callback_states(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The callbacks' states a checkpoint holds, by key. A checkpoint written before callbacks kept their own
    state held two of them in the TrainState: they are read from there."""
    if "callbacks" in checkpoint:
        return dict(checkpoint["callbacks"])
    state = checkpoint["state"]
    return {"divergence": {"first_loss": state.get("first_loss")}, "noise_scale": state.get("noise_ema")}


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """The checkpoint's contents, loaded with weights_only (no code runs). A file torch refuses (an object
    that is not a tensor, another format, a damaged file) raises ConfigError naming it and the remedy."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        if is_out_of_memory(exc):
            raise
        raise ConfigError(f"checkpoint {path} cannot be loaded: {_refusal(exc)}. It was not written by this "
                          f"version of bsresearch, or is damaged; delete it to train the run from the start "
                          f"(`bsresearch train --overwrite` does the same)") from None


def _refusal(exc: Exception) -> str:
    """Why torch.load refused a file, in one line (its weights_only message spans a screen)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"WeightsUnpickler error:\s*(.+)", text)
    if found:  # e.g. "Unsupported global: GLOBAL numpy._core.multiarray.scalar was not an allowed global ..."
        return f"torch refuses it with weights_only=True ({found.group(1).split('. ')[0].strip()})"
    first = text.strip().splitlines()[0].split(". ")[0] if text.strip() else ""
    return f"torch cannot read it ({type(exc).__name__}: {first})"
