"""The one setup: what a run needs before the training loop, resolved the same way at every place a run stands
(driver.drive: a single run, each process of a device group; a fused group; advise's short run).

    setup = run_setup(cfg)                  # device, threads, data, loss, and the task a dry run finds
    member = setup.member(0, cfg, run_dir)  # its state: fresh, or resumed from run_dir's checkpoint
    setup.loop([member], engine, callbacks).run()

Everything that can be wrong with the input fails in `run_setup`, before any training, as one ConfigError:
a model that cannot take the inputs, an output the loss cannot take, a loss that is not a scalar, a
gradient that cannot be computed (`dry_run`), a training set smaller than the batch.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from . import config as C
from . import schedule
from .config import ConfigError, RunConfig
from .data import Data, Dataset, dataset_for
from .loop import Callback, Engine, Loop, Member, RunResult
from .losses import Loss, Task, class_indices, loss_for, task_of
from .measure.functional import measuring
from .model_io import IGNORE_INDEX, Features, Inputs, OutputError, call, describe, logits_of, model_loss_of
from .models import model_for
from .rundir import RunDir
from .runtime import autocast, check_precision, is_out_of_memory, prepare_process, provenance, resolve_device
from .state import TrainState, batch_schedule, callback_states, load_checkpoint, new_state
from .trajectory import Trajectory


@dataclass(frozen=True)
class RunSetup:
    """What a config names, resolved on a device: the data, the loss and the task the targets make (its
    tokens per example, accuracy or not). Shared by the members of a fused group."""
    device: torch.device
    data: Data
    loss: Loss
    task: Task

    @classmethod
    def checked(cls, model: nn.Module, data: Data, loss: Loss, precision: str = "fp32", model_name: str = "model",
                data_name: str = "data") -> RunSetup:
        """The setup of parts a caller already holds (advise: a user's model, tensors and loss), checked by the
        same dry run as a config's (run_setup); the device is the data's."""
        task = dry_run(model, data, loss, precision, model_name, data_name)
        return cls(data.first(1)[0].device, data, loss, task)

    def member(self, index: int, cfg: RunConfig, run_dir: str | Path | RunDir | None = None,
               state: TrainState | None = None,
               resume: bool = True, trajectory: Trajectory | None = None) -> Member:
        """A member of the loop for `cfg`: a fresh TrainState (or `state`), its budget and evaluation steps.
        It continues from the run directory's resumable checkpoint of the same run (with resume), else from
        the latest state saved on `trajectory` (trajectory.py), with the callbacks' states saved there
        (Member.restored) and the global RNG the model draws from (Member.model_rng)."""
        rd = RunDir(run_dir) if isinstance(run_dir, (str, Path)) else run_dir
        n_train, tokens = self.data.n_train, self.task.tokens_per_example
        state = state or new_state(cfg, self.data, self.device)
        state.indices.size_at = batch_schedule(cfg, n_train, tokens)   # a schedule in tokens needs the task's
        member = Member(index, cfg, state, rd, schedule.total_steps(cfg, n_train, tokens),
                        set(schedule.eval_steps(cfg, n_train, tokens)))
        checkpoint = self._checkpoint_to_resume(cfg, rd if resume else None, trajectory)
        if checkpoint is not None:
            state.load_state_dict(checkpoint["state"])
            member.resumed_from, member.restored = state.step, callback_states(checkpoint)
            member.model_rng = checkpoint["state"].get("model_rng")
            member.wall_offset = state.history[-1]["wall_seconds"] if state.history else 0.0
        return member

    def _checkpoint_to_resume(self, cfg: RunConfig, rd: RunDir | None,
                              trajectory: Trajectory | None) -> dict[str, Any] | None:
        if rd and rd.checkpoint_path.exists():
            checkpoint = load_checkpoint(rd.checkpoint_path, self.device)
            if checkpoint.get("resumable") and checkpoint.get("run_id") == C.run_id(cfg):
                return checkpoint
        start = trajectory.start() if trajectory else None   # continue from a state another run saved
        if start is None:
            return None
        checkpoint = load_checkpoint(start, self.device)
        if C.trajectory_key(RunConfig.from_dict(checkpoint["config"])) != C.trajectory_key(cfg):
            raise ConfigError(f"{start} holds the state of another trajectory; delete {start.parent}")
        return checkpoint

    def trajectory(self, cfg: RunConfig, rd: RunDir | None) -> Trajectory | None:
        """The trajectory `cfg`'s run shares with others (None without a run directory or snapshots)."""
        return Trajectory.of(cfg, rd.path, self.data.n_train, self.task.tokens_per_example) if rd else None

    def loop(self, members: Sequence[Member], engine: Engine, callbacks: Sequence[Callback]) -> Loop:
        """The one training loop over `members`."""
        return Loop(members, engine, callbacks, self.data, self.task, self.device)


def run_setup(cfg: RunConfig, data: Data | None = None, model: nn.Module | None = None,
              device: torch.device | None = None) -> RunSetup:
    """Resolve `cfg` for training: its device (and precision on it), the process's threads, its data (or `data`), its
    loss, and the task its targets make, checked in a dry run with `model` (default: a model of cfg built from a
    fixed generator, then dropped: the run's own model is built by RunSetup.member). Raises ConfigError for
    anything the user must change; an out-of-memory error while the data or the model is moved to the device is
    raised as it is. `device`: this process's own device in a device group (bsresearch.devices), else cfg's."""
    device = device if device is not None else resolve_device(cfg.device)
    check_precision(cfg.precision, device)
    prepare_process(cfg.threads)
    data = data if data is not None else dataset_for(cfg, device)
    schedule.check_data_size(cfg, data.n_train)
    if model is None:
        model = model_for(cfg, data, torch.Generator().manual_seed(0)).to(device)
    return RunSetup.checked(model, data, loss_for(cfg.loss), cfg.precision, cfg.model, f"dataset {cfg.dataset}")


def finished_result(run_dir: str | Path | None) -> RunResult | None:
    """The result a run directory already holds when its run has finished (read as it is), else None."""
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd and rd.path.is_dir() and rd.is_finished():
        return RunResult(rd.state() or "ok", rd.metrics(), rd.history_rows(), rd.path)
    return None


def out_of_memory_result(cfg: RunConfig, run_dir: str | Path | None, device: torch.device, message: str,
                         **status: Any) -> RunResult:
    """The result of a run that ran out of memory before its training started (its data or its model on the
    device): state "oom", written to its run directory (config.json too: results.load reads a run without one
    as pending; `status` adds fields to status.json, a fused group's id)."""
    error = f"out of memory while loading the data or building the model on {device}: {message}"
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd:
        rd.write_config(cfg.to_dict(), {"run_id": C.run_id(cfg)})
        rd.write_status("oom", error=error, traceback=None, provenance=provenance(device), **status)
    return RunResult("oom", {}, [], rd.path if rd else None, error)


def _shape(t: object) -> str:
    return describe(t) if isinstance(t, (torch.Tensor, Features)) else type(t).__name__


def _inputs(x: Inputs) -> str:
    return f"(inputs {_shape(x)})" if isinstance(x, torch.Tensor) else f"(a mapping batch of {_shape(x)})"


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def dry_run(model: nn.Module, data: Data, loss: Loss, precision: str = "fp32", model_name: str = "model",
            data_name: str = "data") -> Task:
    """One batch of two training examples through the model, the loss and the backward pass, in train mode
    and the run's precision; the model is left exactly as it was (measure.functional.measuring) and the
    global RNG untouched. Returns the task the targets make (losses.task_of). Whatever does not fit is one
    ConfigError naming the model, the data and the loss: a model that cannot take the inputs (a mapping batch
    names its keys), an output without logits, `loss: model` with a model that returns no loss, an output the
    loss cannot take, a loss that is not a scalar, a gradient that cannot be computed.

    With `loss: model` on sequences, a second forward pass (no gradient) finds whether the model's loss skips
    each sequence's first label (a causal LM shifts its labels by one): the task's `label_shift`, which the
    token-level accumulation counts by."""
    x, y = data.first(min(2, data.n_train))
    device = x.device
    shift = 0
    with measuring(model, "train"), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        stage = f"model {model_name} on a batch of {data_name} {_inputs(x)}"
        try:
            with autocast(precision, device):
                output = call(model, x, y if loss.from_model else None)
            try:
                logits = logits_of(output)
            except OutputError as exc:
                raise ConfigError(f"model {model_name} {exc}") from None
            stage = f"loss {loss.name} on the output of model {model_name} ({_shape(logits)}) and targets {_shape(y)}"
            _check_labels(logits, y, data, model_name, data_name)
            try:
                value = loss(output, y)
            except OutputError as exc:
                raise ConfigError(f"loss model: model {model_name} {exc}") from None
            if not isinstance(value, torch.Tensor) or value.dim() != 0:
                raise ConfigError(f"loss {loss.name} must return a scalar (the mean over the batch); it returned "
                                  f"{_shape(value)} for output {_shape(logits)} and targets {_shape(y)}")
            stage = f"the gradient of loss {loss.name} with respect to model {model_name}'s parameters"
            value.backward()
            if loss.from_model and y.dim() >= 2 and not y.is_floating_point():
                shift = _label_shift(model, x, y, precision)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's model, data or loss that do not fit is their mistake
            if is_out_of_memory(exc):
                raise
            raise ConfigError(f"{stage} failed: {_message(exc)}") from None
    return task_of(loss, logits.detach(), y, data.attributes, shift)


@torch.no_grad()
def _label_shift(model: nn.Module, x: Inputs, y: torch.Tensor, precision: str) -> int:
    """1 when the model's own loss is unchanged with every sequence's first label ignored (it predicts each
    label from the positions before it, a causal LM's shift), else 0. Dropout is off for the comparison."""
    model.eval()
    with autocast(precision, y.device):
        skipped = torch.cat([torch.full_like(y[:, :1], IGNORE_INDEX), y[:, 1:]], 1)
        both = [model_loss_of(call(model, x, labels)) for labels in (y, skipped)]
    return int(bool(torch.equal(both[0], both[1])))


def _check_labels(output: torch.Tensor, y: torch.Tensor, data: Data, model_name: str, data_name: str) -> None:
    """Class-index targets of resident data (all at hand): each must have a class score in the output
    (targets of -100 are padding, ignored)."""
    if not (class_indices(output, y) and isinstance(data, Dataset)):
        return
    labels = torch.cat([data.y_train.reshape(-1), data.y_test.reshape(-1)])
    labels = labels[labels != IGNORE_INDEX]
    if not len(labels):
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= output.shape[-1]:
        raise ConfigError(f"model {model_name} gives {output.shape[-1]} class scores, but the targets of "
                          f"{data_name} run from {low} to {high}: class indices must be 0 to {output.shape[-1] - 1}")
