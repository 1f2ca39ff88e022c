"""`run(cfg, run_dir)`: one training run, the whole experiment, top to bottom.

Setup resolves what the config names (a built-in model, dataset and loss, or the user's own given as
FILE.py:NAME; data.py, models.py, losses.py) and checks it with one batch (forward, loss, backward), so
that everything that can be wrong with the input fails before any work, as one ConfigError. Then the one
training loop (loop.py) trains the run with the single-model engine (engine.py) and the callbacks a run
has (callbacks.py): evaluation, divergence, checkpoints and resume, the noise-scale EMA, progress, and the
run directory.

Conventions (docs/design.md#conventions):
- batch size = examples per optimizer update; micro-batches only split the work (gradient accumulation);
- the loss is a mean over the batch (cross-entropy unless the config names another);
- the learning rate at each step is `config.lr_at(cfg, step, n_train)`, nothing else sets it;
- init, data order and measurement probes draw from separate generators (runtime.Generators).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from . import config as C
from .callbacks import Checkpointing, Divergence, Evaluation, NoiseScale, Progress, Recording, Snapshots, progress_bar
from .config import ConfigError, RunConfig
from .data import Data, Dataset, dataset_for
from .engine import ModelEngine, evaluate, train_step, weight_stats
from .loop import Callback, Loop, Member, RunResult
from .losses import Loss, Task, class_indices, loss_for, task_of
from .measure.functional import measuring
from .models import model_for
from .rundir import RunDir, check_writable
from .runtime import (
    autocast,
    check_precision,
    is_out_of_memory,
    model_randomness,
    oom_message,
    prepare_process,
    provenance,
    resolve_device,
)
from .state import TrainState, batch_schedule, load_checkpoint, new_state, save_checkpoint
from .trajectory import Trajectory

__all__ = ["Components", "RunResult", "TrainState", "components", "dry_run", "evaluate", "load_checkpoint",
           "load_trained_model", "new_state", "progress_bar", "run", "save_checkpoint", "train_step", "weight_stats"]

LOSS_CHECK_EVERY = {"cpu": 1, "cuda": 16}  # steps between divergence checks (each one syncs the device)


def _shape(t: object) -> str:
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" if isinstance(t, torch.Tensor) else \
        type(t).__name__


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def dry_run(model: nn.Module, data: Data, loss: Loss, precision: str = "fp32", model_name: str = "model",
            data_name: str = "data") -> Task:
    """One batch of two training examples through the model, the loss and the backward pass, in train mode
    and the run's precision; the model is left exactly as it was (measure.functional.measuring) and the
    global RNG untouched. Returns the task the targets make (losses.task_of). Whatever does not fit is one
    ConfigError naming the model, the data and the loss: a model that cannot take the inputs, an output the
    loss cannot take, a loss that is not a scalar, a gradient that cannot be computed."""
    x, y = data.first(min(2, data.n_train))
    device = x.device
    with measuring(model, "train"), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        stage = f"model {model_name} on a batch of {data_name} (inputs {_shape(x)})"
        try:
            with autocast(precision, device):
                output = model(x)
            stage = f"loss {loss.name} on the output of model {model_name} ({_shape(output)}) and targets {_shape(y)}"
            if not isinstance(output, torch.Tensor):
                raise ConfigError(f"model {model_name} returned a {type(output).__name__}; it must return a tensor "
                                  f"that the loss takes with the targets")
            _check_labels(output, y, data, model_name, data_name)
            value = loss(output, y)
            if not isinstance(value, torch.Tensor) or value.dim() != 0:
                raise ConfigError(f"loss {loss.name} must return a scalar (the mean over the batch); it returned "
                                  f"{_shape(value)} for output {_shape(output)} and targets {_shape(y)}")
            stage = f"the gradient of loss {loss.name} with respect to model {model_name}'s parameters"
            value.backward()
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's model, data or loss that do not fit is their mistake
            if is_out_of_memory(exc):
                raise
            raise ConfigError(f"{stage} failed: {_message(exc)}") from None
    return task_of(loss, output.detach(), y, data.attributes)


def _check_labels(output: torch.Tensor, y: torch.Tensor, data: Data, model_name: str, data_name: str) -> None:
    """Class-index targets of resident data (all at hand): each must have a class score in the output."""
    if not (class_indices(output, y) and isinstance(data, Dataset)):
        return
    labels = torch.cat([data.y_train.reshape(-1), data.y_test.reshape(-1)])
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= output.shape[-1]:
        raise ConfigError(f"model {model_name} gives {output.shape[-1]} class scores, but the targets of "
                          f"{data_name} run from {low} to {high}: class indices must be 0 to {output.shape[-1] - 1}")


@dataclass(frozen=True)
class Components:
    """What a config names, resolved on a device: its data, its loss and the task the targets make."""
    data: Data
    loss: Loss
    task: Task


def components(cfg: RunConfig, data: Data, model: nn.Module) -> Components:
    """The config's loss, and the task its data's targets make, checked with `model` in a dry run."""
    loss = loss_for(cfg.loss)
    return Components(data, loss, dry_run(model, data, loss, cfg.precision, cfg.model, f"dataset {cfg.dataset}"))


def run(cfg: RunConfig, run_dir: str | Path | None = None, progress: bool | None = None,
        overwrite: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Train `cfg` and write its run directory; the whole experiment, top to bottom. `callbacks` are added to
    the run's own (loop.Callback; e.g. callbacks.AtSteps for a measurement along training).

    Bad configuration raises ConfigError before any work (and before the run directory is written).
    Failures during work (NaN or exploding loss, out of memory, any other exception) end the run with
    state diverged/oom/failed, recorded in status.json; they are returned, not raised. A run directory
    that already holds a finished run is returned as is (unless overwrite); one with a resumable
    checkpoint continues from it exactly.
    """
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd and rd.path.is_dir() and rd.is_finished() and not overwrite:   # read-only storage is fine for these
        return RunResult(rd.state() or "ok", rd.metrics(), rd.history_rows(), rd.path)
    if rd:
        check_writable(rd.path, "--runs or --run-dir")

    # --- setup: everything that can be wrong with the input fails here, before any training
    device = resolve_device(cfg.device)
    check_precision(cfg.precision, device)
    prepare_process(cfg.threads)
    try:  # moving the data and the model to the device can run out of memory: a result ("oom"), not a bug
        data = dataset_for(cfg, device)
        C.check_data_size(cfg, data.n_train)
        state = new_state(cfg, data, device)
        parts = components(cfg, data, state.model)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        error = f"out of memory while loading the data or building the model on {device}: {oom_message(exc)}"
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if rd:  # config.json too: results.load reads a run without one as "pending"
            rd.write_config(cfg.to_dict(), {"run_id": C.run_id(cfg)})
            rd.write_status("oom", error=error, traceback=None, provenance=provenance(device))
        return RunResult("oom", {}, [], rd.path if rd else None, error)

    tokens = parts.task.tokens_per_example
    state.indices.size_at = batch_schedule(cfg, data.n_train, tokens)   # a schedule in tokens needs the task's
    resumed_from, model_rng = None, None
    if rd and rd.checkpoint_path.exists() and not overwrite:
        ckpt = load_checkpoint(rd.checkpoint_path, device)
        if ckpt.get("resumable") and ckpt.get("run_id") == C.run_id(cfg):
            state.load_state_dict(ckpt["state"])
            resumed_from, model_rng = state.step, ckpt["state"].get("model_rng")
    trajectory = Trajectory.of(cfg, rd.path, data.n_train, tokens) if rd else None
    if trajectory and resumed_from is None:   # continue from a state another run of the trajectory saved
        start = trajectory.start()
        if start is not None:
            ckpt = load_checkpoint(start, device)
            if C.trajectory_key(RunConfig.from_dict(ckpt["config"])) != C.trajectory_key(cfg):
                raise ConfigError(f"{start} holds the state of another trajectory; delete {start.parent}")
            state.load_state_dict(ckpt["state"])
            resumed_from, model_rng = state.step, ckpt["state"].get("model_rng")
    member = Member(0, cfg, state, rd, C.total_steps(cfg, data.n_train, tokens),
                    set(C.eval_steps(cfg, data.n_train, tokens)), resumed_from=resumed_from,
                    wall_offset=state.history[-1]["wall_seconds"] if state.history else 0.0)
    own = [Evaluation(), Divergence(), Checkpointing(), *([Snapshots(trajectory)] if trajectory else []),
           NoiseScale(), Progress(progress), Recording()]
    with model_randomness(cfg.seed, device, model_rng):   # dropout repeats with the seed, and across a resume
        Loop([member], ModelEngine(data, parts.loss, parts.task), [*own, *callbacks], data, parts.task, device,
             LOSS_CHECK_EVERY.get(device.type, 1)).run()
    assert member.result is not None
    return member.result


def load_trained_model(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, RunConfig]:
    """Rebuild a run's model from its config.json and load its final weights from checkpoint.pt."""
    rd = RunDir(run_dir)
    if not rd.checkpoint_path.exists():
        raise FileNotFoundError(f"{rd.checkpoint_path} does not exist (was the run saved with save_checkpoint?)")
    cfg = RunConfig.from_dict({k: v for k, v in rd.config().items() if k != "derived"})
    data = None if C.is_reference(cfg.model) else dataset_for(cfg, "cpu")  # a built-in model's input shape
    model = model_for(cfg, data, torch.Generator())
    model.load_state_dict(load_checkpoint(rd.checkpoint_path)["state"]["model"])
    return model.to(device), cfg
