"""The training loop: TrainState, one optimizer step, evaluation, and `run`, which writes a run directory.

Read `run` top to bottom: it is the whole experiment. Conventions (docs/design.md#conventions):
- batch size = examples per optimizer update; micro-batches only split the work (gradient accumulation);
- the loss is the mean cross-entropy over the batch;
- the learning rate at each step is `config.lr_at(cfg, step, n_train)`, nothing else sets it;
- init, data order and measurement probes draw from separate generators (runtime.Generators).
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import config as C
from .config import ConfigError, RunConfig
from .data import BatchSampler, Dataset, dataset_for, in_chunks
from .models import build_model, count_parameters
from .noise_tracker import NoiseScaleEMA, noise_ema_columns, squared_grad_norm, update_noise_ema
from .rundir import RunDir, atomic_write_bytes
from .runtime import (
    Generators,
    autocast,
    check_precision,
    is_out_of_memory,
    oom_message,
    provenance,
    resolve_device,
    set_threads,
    synchronize,
)
from .step import make_optimizer, training_step

EVAL_CHUNK = 2048          # examples per forward pass during evaluation
LOSS_CHECK_EVERY = {"cpu": 1, "cuda": 16}  # steps between divergence checks (each one syncs the device)


@dataclass
class TrainState:
    """Everything that changes during training; saved whole in a resumable checkpoint."""
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    sampler: BatchSampler
    generators: Generators
    initial_params: list[torch.Tensor]  # for the distance from initialisation
    step: int = 0                       # optimizer updates done
    examples_seen: int = 0
    first_loss: float | None = None     # the reference for divergence
    train_seconds: float = 0.0          # time spent in training steps (evaluation excluded)
    history: list[dict[str, Any]] = field(default_factory=list)
    noise_ema: NoiseScaleEMA | None = None  # two-batch noise scale from micro-batches (cfg.noise_scale_every)

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "sampler": self.sampler.state_dict(), "generators": self.generators.state_dict(),
                "initial_params": self.initial_params, "step": self.step, "examples_seen": self.examples_seen,
                "first_loss": self.first_loss, "train_seconds": self.train_seconds, "history": self.history,
                "noise_ema": dataclasses.asdict(self.noise_ema) if self.noise_ema else None}

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
        self.first_loss, self.train_seconds = state["first_loss"], float(state["train_seconds"])
        self.history = list(state["history"])
        self.noise_ema = NoiseScaleEMA(**state["noise_ema"]) if state.get("noise_ema") else None


def new_state(cfg: RunConfig, data: Dataset, device: torch.device) -> TrainState:
    """Fresh model (weights from the 'init' generator only), optimizer and sampler for `cfg`."""
    gens = Generators.from_seed(cfg.seed, device)
    model = build_model(cfg, data.input_shape, data.num_classes, gens.init).to(device)
    scaler = torch.amp.GradScaler("cuda") if cfg.precision == "fp16" else None
    sampler = BatchSampler(data.n_train, cfg.batch_size, gens.data, replacement=cfg.sampling == "replacement")
    return TrainState(model=model, optimizer=make_optimizer(cfg, model), scaler=scaler, sampler=sampler,
                      generators=gens, initial_params=[p.detach().clone() for p in model.parameters()])


def train_step(state: TrainState, cfg: RunConfig, data: Dataset, lr: float) -> torch.Tensor:
    """One optimizer update (step.training_step) on the next batch (cfg.batch_size examples, or the batch
    schedule's size at this step); returns the batch's mean loss (a tensor).

    With micro_batch_size, the batch is split and gradients accumulate (step.training_step weights each
    micro-batch's loss by its share). Every cfg.noise_scale_every steps, |G_small|^2 (the first
    micro-batch's gradient alone) and |G_big|^2 (the whole batch's) feed the two-batch noise-scale EMA:
    both at the same parameters, no drift.
    """
    if cfg.batch_schedule != "constant":  # the batch grows at its milestones; the epoch's permutation goes on
        state.sampler.batch_size = C.batch_size_at(cfg, state.step, data.n_train)
    idx = state.sampler.next()
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    micro_batches = idx.split(cfg.micro_batch_size) if cfg.micro_batch_size else (idx,)
    batches = [(data.x_train[micro], data.y_train[micro]) for micro in micro_batches]
    small_sq_norm: list[torch.Tensor] = []

    def after_backward(i: int) -> None:
        if i == 0:  # undo the micro-batch weight: the small batch's own mean-loss gradient
            small_sq_norm.append(squared_grad_norm(state.model) / (len(micro_batches[0]) / len(idx)) ** 2)

    def before_update() -> None:
        grad_scale_sq = state.scaler.get_scale() ** 2 if state.scaler else 1.0
        state.noise_ema = update_noise_ema(state.noise_ema or NoiseScaleEMA(cfg.noise_scale_ema),
                                           float(small_sq_norm[0]) / grad_scale_sq,
                                           float(squared_grad_norm(state.model)) / grad_scale_sq,
                                           len(micro_batches[0]), len(idx))

    sample_noise = cfg.noise_scale_every > 0 and state.step % cfg.noise_scale_every == 0
    loss = training_step(state.model, state.optimizer, batches, cfg.precision, state.scaler,
                         after_backward=after_backward if sample_noise else None,
                         before_update=before_update if sample_noise else None)
    state.step += 1
    state.examples_seen += len(idx)
    return loss


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str = "fp32",
             chunk_size: int = EVAL_CHUNK) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of `model` on (x, y), in eval mode (BatchNorm running statistics).

    The model's train/eval mode is restored afterwards.
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=x.device, dtype=torch.float64)
    correct = torch.zeros((), device=x.device, dtype=torch.int64)
    for xb, yb in in_chunks(x, y, chunk_size):
        with autocast(precision, x.device):
            logits = model(xb)
        loss_sum += F.cross_entropy(logits.float(), yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
    model.train(was_training)
    return loss_sum.item() / len(x), correct.item() / len(x)


@torch.no_grad()
def weight_stats(state: TrainState) -> tuple[float, float]:
    """(L2 distance from the initial weights, L2 norm of the weights), over all parameters."""
    params = [p.detach().float() for p in state.model.parameters()]
    distance = sum(((p - p0.float()) ** 2).sum() for p, p0 in zip(params, state.initial_params))
    norm = sum((p ** 2).sum() for p in params)
    return math.sqrt(float(distance)), math.sqrt(float(norm))


def evaluation_row(state: TrainState, cfg: RunConfig, data: Dataset, n_train: int, wall_s: float) -> dict[str, Any]:
    """One history row: where training is, and train/test loss and accuracy (eval-mode BatchNorm)."""
    n_eval = cfg.eval_train_size or data.n_train
    train_loss, train_acc = evaluate(state.model, data.x_train[:n_eval], data.y_train[:n_eval], cfg.precision)
    test_loss, test_acc = evaluate(state.model, data.x_test, data.y_test, cfg.precision)
    distance, norm = weight_stats(state)
    return {"step": state.step, "epoch": state.examples_seen / n_train, "examples": state.examples_seen,
            "lr": C.lr_at(cfg, max(state.step - 1, 0), n_train),
            **({"current_batch_size": C.batch_size_at(cfg, max(state.step - 1, 0), n_train)}
               if cfg.batch_schedule != "constant" else {}),
            "train_loss": train_loss, "train_acc": train_acc, "test_loss": test_loss, "test_acc": test_acc,
            "distance_from_init": distance, "weight_norm": norm,
            "train_seconds": state.train_seconds, "wall_seconds": wall_s,
            **(noise_ema_columns(state.noise_ema) if cfg.noise_scale_every else {})}


@dataclass
class RunResult:
    """What `run` returns: the final state name, metrics and history (also on disk when run_dir is set)."""
    state: str
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    run_dir: Path | None = None
    error: str | None = None
    model: nn.Module | None = field(default=None, repr=False)

    def summary(self, max_rows: int = 12) -> str:
        """A small fixed-width table of the history (evenly thinned) and the final numbers."""
        rows = self.history
        if len(rows) > max_rows:
            keep = sorted({round(i * (len(rows) - 1) / (max_rows - 1)) for i in range(max_rows)})
            rows = [rows[i] for i in keep]
        lines = [f"{'step':>8} {'epoch':>8} {'lr':>9} {'train_loss':>10} {'train_acc':>9} "
                 f"{'test_loss':>9} {'test_acc':>8}"]
        for r in rows:
            lines.append(f"{int(r['step']):>8d} {float(r['epoch']):>8.2f} {float(r['lr']):>9.3g} "
                         f"{float(r['train_loss']):>10.4f} {float(r['train_acc']):>9.4f} "
                         f"{float(r['test_loss']):>9.4f} {float(r['test_acc']):>8.4f}")
        m = self.metrics
        lines.append(f"state: {self.state}" + (f" ({self.error})" if self.error else ""))
        if "test_acc" in m:
            lines.append(f"final: train_loss {m['train_loss']:.4g}  test_acc {m['test_acc']:.4f}  "
                         f"gap(acc) {m['gap_acc']:.4f}  steps {m['steps']}  {m['train_seconds']:.1f}s training")
        if self.run_dir:
            lines.append(f"run directory: {self.run_dir}")
        return "\n".join(lines)


def _final_metrics(cfg: RunConfig, state: TrainState, history: list[dict], n_train: int) -> dict[str, Any]:
    last = history[-1]
    reached = next((r for r in history if r["train_loss"] <= cfg.target_loss), None)
    return {
        "steps": state.step, "examples": state.examples_seen, "epochs": state.examples_seen / n_train,
        "train_loss": last["train_loss"], "train_acc": last["train_acc"],
        "test_loss": last["test_loss"], "test_acc": last["test_acc"],
        "gap_acc": last["train_acc"] - last["test_acc"], "gap_loss": last["test_loss"] - last["train_loss"],
        "target_loss": cfg.target_loss, "reached_target": reached is not None,
        "steps_to_target": reached["step"] if reached else None,
        "examples_to_target": reached["examples"] if reached else None,
        "distance_from_init": last["distance_from_init"], "weight_norm": last["weight_norm"],
        "train_seconds": state.train_seconds, "wall_seconds": last["wall_seconds"],
        "steps_per_second": state.step / state.train_seconds if state.train_seconds > 0 else None,
        "n_parameters": count_parameters(state.model),
    }


def save_checkpoint(path: Path, cfg: RunConfig, state: TrainState, resumable: bool) -> None:
    """Atomically save the whole TrainState (resumable) so a rerun continues exactly where it stopped."""
    buffer = io.BytesIO()
    torch.save({"config": cfg.to_dict(), "run_id": C.run_id(cfg), "resumable": resumable,
                "state": state.state_dict()}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


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


def load_trained_model(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, RunConfig]:
    """Rebuild a run's model from its config.json and load its final weights from checkpoint.pt."""
    rd = RunDir(run_dir)
    if not rd.checkpoint_path.exists():
        raise FileNotFoundError(f"{rd.checkpoint_path} does not exist (was the run saved with save_checkpoint?)")
    cfg = RunConfig.from_dict({k: v for k, v in rd.config().items() if k != "derived"})
    data = dataset_for(cfg, "cpu")
    model = build_model(cfg, data.input_shape, data.num_classes, torch.Generator())
    model.load_state_dict(load_checkpoint(rd.checkpoint_path)["state"]["model"])
    return model.to(device), cfg


def _progress_bar(total: int, enabled: bool | None):
    """A step bar; by default on a terminal, and in a notebook that JupyterLab runs (a widget there: the
    Jupyter server names its kernels' sessions in JPY_SESSION_NAME), off under papermill and in logs."""
    from tqdm.auto import tqdm
    if enabled is None:
        enabled = sys.stderr.isatty() or ("ipykernel" in sys.modules and bool(os.environ.get("JPY_SESSION_NAME")))
    return tqdm(total=total, unit="step", disable=not enabled, leave=False, dynamic_ncols=True)


def run(cfg: RunConfig, run_dir: str | Path | None = None, progress: bool | None = None,
        overwrite: bool = False) -> RunResult:
    """Train `cfg` and write its run directory; the whole experiment, top to bottom.

    Bad configuration raises ConfigError before any work. Failures during work (NaN or exploding loss,
    out of memory, any other exception) end the run with state diverged/oom/failed, recorded in
    status.json; they are returned, not raised. A run directory that already holds a finished run is
    returned as is (unless overwrite); one with a resumable checkpoint continues from it exactly.
    """
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd and rd.is_finished() and not overwrite:
        return RunResult(rd.state() or "ok", rd.metrics(), rd.history_rows(), rd.path)

    # --- setup: everything that can be wrong with the input fails here, before any training
    device = resolve_device(cfg.device)
    check_precision(cfg.precision, device)
    set_threads(cfg.threads)
    try:  # moving the data and the model to the device can run out of memory: a result ("oom"), not a bug
        data = dataset_for(cfg, device)
        n_train = data.n_train
        C.check_batch_fits(cfg, n_train)
        if cfg.eval_train_size and cfg.eval_train_size > n_train:
            raise ConfigError(f"eval_train_size {cfg.eval_train_size} exceeds the training set size {n_train}")
        total = C.total_steps(cfg, n_train)
        evals = set(C.eval_steps(cfg, n_train))
        check_every = LOSS_CHECK_EVERY.get(device.type, 1)
        state = new_state(cfg, data, device)
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

    resumed_from = None
    if rd and rd.checkpoint_path.exists() and not overwrite:
        ckpt = load_checkpoint(rd.checkpoint_path, device)
        if ckpt.get("resumable") and ckpt.get("run_id") == C.run_id(cfg):
            state.load_state_dict(ckpt["state"])
            resumed_from = state.step
    if rd:
        rd.write_config(cfg.to_dict(), C.derived(cfg, n_train))
        rd.write_status("running", started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), resumed_from=resumed_from,
                        error=None, traceback=None, provenance=provenance(device))

    # --- the loop
    wall_start = time.perf_counter() - (state.history[-1]["wall_seconds"] if state.history else 0.0)
    outcome, error, trace = "ok", None, None
    pending: list[torch.Tensor] = []   # batch losses not yet checked for divergence
    bar = _progress_bar(total, progress)
    bar.update(state.step)
    synchronize(device)
    segment_start = time.perf_counter()  # training time is measured between evaluations, not per step

    def stop_clock() -> None:
        nonlocal segment_start
        synchronize(device)
        state.train_seconds += time.perf_counter() - segment_start
        segment_start = time.perf_counter()

    def record_evaluation() -> dict[str, Any]:
        nonlocal segment_start
        stop_clock()
        row = evaluation_row(state, cfg, data, n_train, time.perf_counter() - wall_start)
        state.history.append(row)
        if rd:
            rd.write_history(state.history)
        bar.set_postfix(train_loss=f"{row['train_loss']:.4f}", test_acc=f"{row['test_acc']:.3f}")
        segment_start = time.perf_counter()
        return row

    try:
        while True:
            if state.step in evals and not (state.history and state.history[-1]["step"] == state.step):
                row = record_evaluation()
                if cfg.budget == "target" and row["train_loss"] <= cfg.target_loss:
                    break
            if state.step >= total:
                break

            pending.append(train_step(state, cfg, data, C.lr_at(cfg, state.step, n_train)))
            bar.update(1)
            if len(pending) >= check_every or state.step in evals or state.step >= total:
                losses = torch.stack(pending).tolist()
                pending.clear()
                if state.first_loss is None:
                    state.first_loss = losses[0]
                bad = next((x for x in losses if not math.isfinite(x) or x > cfg.divergence_ratio * state.first_loss),
                           None)
                if bad is not None:
                    outcome = "diverged"
                    error = f"batch loss {bad:.4g} by step {state.step} (first batch loss {state.first_loss:.4g})"
                    record_evaluation()
                    break
            if rd and cfg.checkpoint_every and state.step % cfg.checkpoint_every == 0 and state.step < total:
                stop_clock()
                save_checkpoint(rd.checkpoint_path, cfg, state, resumable=True)
                segment_start = time.perf_counter()
    except Exception as exc:  # noqa: BLE001 - recorded, the caller (a sweep) carries on
        if is_out_of_memory(exc):
            outcome, error = "oom", f"out of memory at step {state.step}: {oom_message(exc)}"
        else:
            outcome, error, trace = "failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()
    finally:
        bar.close()

    # --- results
    metrics = _final_metrics(cfg, state, state.history, n_train) if state.history else {}
    if outcome == "ok" and cfg.measure:
        from .measure import take_measurements
        metrics.update(take_measurements(cfg.measure, state.model, data, cfg, state.generators.probe))
    if rd:
        rd.write_history(state.history)
        rd.write_metrics(metrics)
        if outcome in ("oom", "failed"):
            if device.type == "cuda":
                torch.cuda.empty_cache()
        elif cfg.save_checkpoint:
            save_checkpoint(rd.checkpoint_path, cfg, state, resumable=False)
        elif rd.checkpoint_path.exists():
            rd.checkpoint_path.unlink()
        rd.write_status(outcome, error=error, traceback=trace)
    return RunResult(outcome, metrics, state.history, rd.path if rd else None, error, state.model)
