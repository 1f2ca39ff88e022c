"""The pieces of the training loop that differ between paths, as callbacks (loop.Callback).

    phase (loop.Order)
    Evaluation    DECIDE      evaluate at each member's eval steps; stop a member whose train loss reached
                              its target
    Divergence    DECIDE      check batch losses every few steps; a non-finite or exploding loss ends the member
    Snapshots     SNAPSHOT    the states a trajectory saves for the runs that branch from it
    Measurements  MEASURE     the measurements a config names (bsresearch.measurements), when a member ends ok
    Stability     MEASURE     with cfg.stability, the edge-of-stability columns of each evaluation's row
    WeightAverage MEASURE     with cfg.eval_weight_average, an EMA of the weights that the evaluations read
    Progress      PROGRESS    a progress bar (a terminal, JupyterLab; not under papermill or in logs)
    Recording     RECORD      the run directory: config.json and status.json at the start, history.csv at
                              each evaluation, metrics.json (with Measurements' numbers), the final checkpoint
                              and the final status when a member stops; and the member's RunResult
    AtSteps       USER        a function of yours at chosen steps (a measurement along training), off the clock
    Checkpointing CHECKPOINT  a resumable checkpoint every checkpoint_every steps, after every other callback

The noise scale from a step's micro-batches (or a device group's gradients) is bsresearch.noise's, beside
the other estimators. Which of these a run has is chosen by where it stands (driver.callbacks_for).

Each keeps its own state: Divergence the first batch loss of every member (the reference), given to each
checkpoint under its `key` and taken back at a resume.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from . import schedule
from .data import Dataset, resident_dataset_for
from .loop import Callback, Loop, Member, Order, RunResult
from .losses import loss_for
from .measure.functional import batches_of
from .measure.stability import edge_of_stability
from .measurements import take_measurements
from .models import count_parameters
from .rundir import storage_error
from .runtime import derive_seed, provenance
from .trajectory import Trajectory

LOSS_CHECK_EVERY = {"cpu": 1, "cuda": 16}  # steps between divergence checks by device (each one syncs the device)


class Evaluation(Callback):
    """Evaluate members at their eval steps (schedule.eval_steps); a member with budget 'target' whose train
    loss reached target_loss stops there."""
    order = Order.DECIDE

    def before_step(self, loop: Loop) -> None:
        due = [m for m in loop.active
               if m.state.step in m.evals and not (m.state.history and m.state.history[-1]["step"] == m.state.step)]
        if not due:
            return
        loop.evaluate(due)
        reached = [m for m in due
                   if m.cfg.budget == "target" and m.state.history[-1]["train_loss"] <= m.cfg.target_loss]
        if reached:
            loop.stop(reached)


class Divergence(Callback):
    """Every `check_every` steps (and at eval steps and the last step), a member whose batch loss is not
    finite or exceeds divergence_ratio x its first batch loss ends 'diverged', evaluated where it stopped.
    check_every defaults to LOSS_CHECK_EVERY for the loop's device (a check syncs the device). Its state:
    each member's first batch loss (checkpointed) and the step up to which its losses were checked."""
    order = Order.DECIDE
    key = "divergence"

    def __init__(self, check_every: int | None = None) -> None:
        self.check_every = check_every
        self.pending: list[torch.Tensor] = []  # batch losses (K_active,) of recent steps, not yet checked by all
        self.first_loss: dict[int, float] = {}   # member index -> its first batch loss, the reference
        self.checked: dict[int, int] = {}       # member index -> the step up to which its losses were checked

    def state_dict(self, member: Member) -> dict[str, Any]:
        return {"first_loss": self.first_loss.get(member.index)}

    def load_state_dict(self, member: Member, state: dict[str, Any]) -> None:
        if state.get("first_loss") is not None:
            self.first_loss[member.index] = float(state["first_loss"])

    def on_start(self, loop: Loop) -> None:
        if self.check_every is None:
            self.check_every = LOSS_CHECK_EVERY.get(loop.device.type, 1)
        for m in loop.active:
            self.checked[m.index] = m.state.step

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        assert self.check_every is not None
        self.pending.append(losses)
        step = loop.step
        closing = [r for r, m in enumerate(loop.active)
                   if step - self.checked[m.index] >= self.check_every or step in m.evals or step >= m.total]
        if not closing:
            return
        values = torch.stack(self.pending).tolist()  # (steps, K_active): one device sync
        diverged = []
        for r in closing:
            m = loop.active[r]
            mine = [row[r] for row in values[len(values) - (step - self.checked[m.index]):]]
            self.checked[m.index] = step
            first = self.first_loss.setdefault(m.index, mine[0])
            bad = next((x for x in mine if not math.isfinite(x) or x > m.cfg.divergence_ratio * first), None)
            if bad is not None:
                m.outcome = "diverged"
                m.error = f"batch loss {bad:.4g} by step {step} (first batch loss {first:.4g})"
                diverged.append(m)
        oldest = min(self.checked[m.index] for m in loop.active)
        self.pending = self.pending[len(self.pending) - (step - oldest):] if step > oldest else []
        if diverged:
            loop.evaluate(diverged)
            loop.stop(diverged)

    def on_remove(self, loop: Loop, keep: torch.Tensor) -> None:
        self.pending = [p[keep] for p in self.pending]


class Checkpointing(Callback):
    """A resumable checkpoint of each member every cfg.checkpoint_every steps (not at the last step: the
    final weights are Recording's). Its phase is the last: every callback whose state it saves has done its
    after_step when it saves."""
    order = Order.CHECKPOINT

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        for m in loop.active:
            every = m.cfg.checkpoint_every
            if m.rd and every and m.state.step % every == 0 and m.state.step < m.total:
                with loop.paused():
                    loop.save(m, m.rd.checkpoint_path, resumable=True)


class Snapshots(Callback):
    """Save the run's whole state at its trajectory's snapshot steps (after their evaluation), for the runs
    that continue from them (bsresearch/trajectory.py); let go of the trajectory once past its end, and at
    the close whatever happened."""
    order = Order.SNAPSHOT

    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory

    def before_step(self, loop: Loop) -> None:
        t = self.trajectory
        for m in loop.active:
            if m.state.step in t.saves and not t.path(m.state.step).exists():
                with loop.paused():
                    loop.save(m, t.path(m.state.step), resumable=True)
            if m.state.step >= t.end:
                t.release()

    def close(self, loop: Loop) -> None:
        self.trajectory.release()


class AtSteps(Callback):
    """Call fn(member, loop) when a member has done each number of steps in `steps` (before its next update;
    a step past the budget never comes); its time is not training time. For measurements along training:
    `run(cfg, callbacks=[AtSteps([0, 10, 100], measure)])`, the model being member.state.model."""

    def __init__(self, steps: Any, fn: Any) -> None:
        self.steps, self.fn = {int(s) for s in steps}, fn
        self.done: set[tuple[int, int]] = set()

    def before_step(self, loop: Loop) -> None:
        for m in loop.active:
            key = (m.index, m.state.step)
            if m.state.step in self.steps and key not in self.done:
                self.done.add(key)
                with loop.paused():
                    self.fn(m, loop)


def progress_bar(total: int, enabled: bool | None):
    """A step bar; by default on a terminal, and in a notebook that JupyterLab runs (a widget there: the
    Jupyter server names its kernels' sessions in JPY_SESSION_NAME), off under papermill and in logs."""
    from tqdm.auto import tqdm
    if enabled is None:
        enabled = sys.stderr.isatty() or ("ipykernel" in sys.modules and bool(os.environ.get("JPY_SESSION_NAME")))
    return tqdm(total=total, unit="step", disable=not enabled, leave=False, dynamic_ncols=True)


class Progress(Callback):
    """A bar over the longest member's steps; the last evaluation's numbers beside it."""
    order = Order.PROGRESS

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def on_start(self, loop: Loop) -> None:
        self.bar = progress_bar(max((m.total for m in loop.active), default=0), self.enabled)
        self.bar.update(loop.step)

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_evaluation(self, loop: Loop, member: Member) -> None:
        row = member.state.history[-1]
        if self.bar is not None and len(loop.members) == 1:
            self.bar.set_postfix({"train_loss": f"{row['train_loss']:.4f}",
                                  **({"test_acc": f"{row['test_acc']:.3f}"} if "test_acc" in row else {})})

    def close(self, loop: Loop) -> None:
        if self.bar is not None:
            self.bar.close()


def final_metrics(m: Member, loop: Loop) -> dict[str, Any]:
    """metrics.json's numbers from the member's last evaluation and its state."""
    cfg, state, history, task, n_train = m.cfg, m.state, m.state.history, loop.task, loop.data.n_train
    last = history[-1]
    reached = next((r for r in history if r["train_loss"] <= cfg.target_loss), None)
    out: dict[str, Any] = {"steps": state.step, "examples": state.examples_seen,
                           "epochs": state.examples_seen / n_train}
    if task.kind == "sequence":
        out["tokens"] = state.examples_seen * task.tokens_per_example
    out.update(train_loss=last["train_loss"], **({"train_acc": last["train_acc"]} if task.accuracy else {}),
               test_loss=last["test_loss"], **({"test_acc": last["test_acc"]} if task.accuracy else {}))
    if task.accuracy:
        out["gap_acc"] = last["train_acc"] - last["test_acc"]
    out["gap_loss"] = last["test_loss"] - last["train_loss"]
    if task.bits_column:
        out[f"train_{task.bits_column}"] = last[f"train_{task.bits_column}"]
        out[f"test_{task.bits_column}"] = last[f"test_{task.bits_column}"]
    out.update({
        "target_loss": cfg.target_loss, "reached_target": reached is not None,
        "steps_to_target": reached["step"] if reached else None,
        "examples_to_target": reached["examples"] if reached else None,
        "distance_from_init": last["distance_from_init"], "weight_norm": last["weight_norm"],
        "train_seconds": state.train_seconds, "wall_seconds": last["wall_seconds"],
        "steps_per_second": state.step / state.train_seconds if state.train_seconds > 0 else None,
        "n_parameters": count_parameters(state.model),
    })
    return out


def training_data(loop: Loop, cfg: Any) -> Dataset:
    """The run's data as tensors (x_train, y_train) for a measurement: the loop's, or loaded resident when the
    loop streams it."""
    return loop.data if isinstance(loop.data, Dataset) else resident_dataset_for(cfg, loop.device)


class Measurements(Callback):
    """The measurements a member's config names (cfg.measure, bsresearch.measurements), taken when it ends ok, on its
    final weights, into member.measured (Recording adds them to metrics.json)."""
    order = Order.MEASURE

    def on_finish(self, loop: Loop, member: Member) -> None:
        cfg, state = member.cfg, member.state
        if member.outcome == "ok" and cfg.measure:
            member.measured.update(take_measurements(cfg.measure, state.model, training_data(loop, cfg), cfg,
                                                     state.generators.probe))


class Stability(Callback):
    """With cfg.stability, at each evaluation, on the member's weights and off the clock, the columns of
    measure.stability.edge_of_stability in its history row: the training loss's top Hessian eigenvalue
    (`sharpness`, over the first measure_train_size examples, all by default; `sharpness_converged`), Adam's
    `preconditioned_sharpness`, the optimizer's `sharpness_limit`, the `batch_sharpness` averaged over
    cfg.stability_batches mini-batches of batch_size (each drawn without replacement from the training set; the
    ratio of their means in `batch_sharpness_pooled`) and
    the variance of their gradients along the top eigenvector (`noise_along_top`; `grad_along_top` the full
    gradient's component). The draws and the Lanczos start vector come from a generator of the seed and the
    step, so a resumed run measures as the uninterrupted one."""
    order = Order.MEASURE

    def columns(self, loop: Loop, member: Member) -> dict[str, Any]:
        cfg, state = member.cfg, member.state
        if not cfg.stability:
            return {}
        data = training_data(loop, cfg)
        loss, model = loss_for(cfg.loss), state.model
        n = min(cfg.measure_train_size or data.n_train, data.n_train)
        chunks = batches_of(data.x_train[:n], data.y_train[:n])

        def full() -> torch.Tensor:
            total: Any = sum(loss.of(model, xb, yb) * (len(yb) / n) for xb, yb in chunks)
            return total

        generator = torch.Generator().manual_seed(derive_seed(cfg.seed, f"stability/step-{state.step}"))
        draws = [torch.randperm(data.n_train, generator=generator)[:cfg.batch_size]
                 for _ in range(cfg.stability_batches)]

        def batch(index: torch.Tensor) -> Any:
            index = index.to(data.y_train.device)
            return lambda: loss.of(model, data.x_train[index], data.y_train[index])
        return edge_of_stability(model, full, [batch(i) for i in draws], state.optimizer, generator=generator)


class WeightAverage(Callback):
    """With cfg.eval_weight_average = d > 0, an exponential moving average of each member's parameters, from
    its starting weights and updated after every step (avg <- d avg + (1 - d) w; the EWA of Zhang et al. 2025,
    torch's AveragedModel EMA), which the evaluations read in place of the weights: train and test loss and
    accuracy (BatchNorm's running statistics stay the model's own). Training, distance_from_init and
    weight_norm, the measurements at the end and the saved weights are of the weights themselves. The average
    goes into each checkpoint (`key`), so a resumed run evaluates as the uninterrupted one."""
    order = Order.MEASURE
    key = "weight_average"

    def __init__(self) -> None:
        self.averages: dict[int, list[torch.Tensor]] = {}   # member index -> its average, parameter by parameter

    @staticmethod
    def _parameters(member: Member) -> list[torch.Tensor]:
        return [p.detach() for p in member.state.model.parameters()]

    def on_start(self, loop: Loop) -> None:
        for m in loop.active:
            if m.cfg.eval_weight_average and m.index not in self.averages:
                self.averages[m.index] = [p.clone() for p in self._parameters(m)]

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        for m in loop.active:
            average = self.averages.get(m.index)
            if average is not None:
                torch._foreach_lerp_(average, self._parameters(m), 1.0 - m.cfg.eval_weight_average)

    @contextlib.contextmanager
    def evaluated_weights(self, loop: Loop, members: list[Member]) -> Iterator[None]:
        swapped = [(self._parameters(m), self.averages[m.index]) for m in members if m.index in self.averages]
        saved = [[p.clone() for p in params] for params, _ in swapped]
        with torch.no_grad():
            for params, average in swapped:
                torch._foreach_copy_(params, average)
        try:
            yield
        finally:
            with torch.no_grad():
                for (params, _), kept in zip(swapped, saved, strict=True):
                    torch._foreach_copy_(params, kept)

    def state_dict(self, member: Member) -> dict[str, Any] | None:
        average = self.averages.get(member.index)
        return {"average": [t.clone() for t in average]} if average is not None else None

    def load_state_dict(self, member: Member, state: dict[str, Any]) -> None:
        self.averages[member.index] = [t.clone() for t in state["average"]]


def attempts(previous: dict[str, Any] | None, started: str, resumed_from: int | None,
             devices: int) -> list[dict[str, Any]]:
    """status.json's `attempts`: one entry per start of the run (when it started, the step it resumed from,
    on how many devices); a run that starts from scratch begins a new list."""
    earlier = list((previous or {}).get("attempts") or []) if resumed_from is not None else []
    return [*earlier, {"started": started, "resumed_from": resumed_from, "devices": devices}]


class Recording(Callback):
    """Each member's run directory (when it has one) and its RunResult, with the numbers of Measurements.
    `status` adds fields to every status.json written: where this attempt runs (`devices`: the devices of
    the attempt that wrote it), a fused group's id; `attempts` lists every start with its device count."""
    order = Order.RECORD

    def __init__(self, status: Mapping[str, Any] | None = None) -> None:
        self.status = dict(status or {})

    def on_start(self, loop: Loop) -> None:
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        devices = int((self.status.get("devices") or {}).get("count", 1))
        for m in loop.active:
            if m.rd:
                derived = schedule.derived(m.cfg, loop.data.n_train, loop.task.tokens_per_example)
                m.rd.write_config(m.cfg.to_dict(), {**derived, **loop.task.describe()})
                m.rd.write_status("running", started=started, resumed_from=m.resumed_from, error=None, traceback=None,
                                  provenance=provenance(loop.device),
                                  attempts=attempts(m.rd.status(), started, m.resumed_from, devices), **self.status)

    def on_evaluation(self, loop: Loop, member: Member) -> None:
        if member.rd:
            member.rd.write_history(member.state.history)

    def on_finish(self, loop: Loop, member: Member) -> None:
        m, cfg, state, rd = member, member.cfg, member.state, member.rd
        metrics: dict[str, Any] = {**(final_metrics(m, loop) if state.history else {}), **m.measured}
        if rd:
            try:
                rd.write_history(state.history)
                rd.write_metrics(metrics)
                if m.outcome in ("oom", "failed", "died"):   # the last resumable checkpoint stays (a device group
                    if loop.device.type == "cuda":           # that lost a process: died mid-step)
                        torch.cuda.empty_cache()
                elif cfg.save_checkpoint:
                    loop.save(m, rd.checkpoint_path, resumable=False)
                elif rd.checkpoint_path.exists():
                    rd.checkpoint_path.unlink()
            except OSError as exc:  # the disk is full or read-only: the run failed for it, and says so
                if not storage_error(exc):
                    raise
                m.outcome, m.error, m.trace = "failed", f"the run directory could not be written: {exc}", None
            rd.write_status(m.outcome, error=m.error, traceback=m.trace, **self.status)
        m.result = RunResult(m.outcome, metrics, state.history, rd.path if rd else None, m.error, state.model)
