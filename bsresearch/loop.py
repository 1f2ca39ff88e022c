"""The training loop: the one loop of every path that trains (a single run, a device group, a fused group, advise).

The loop moves its members (runs) in lockstep, one optimizer update each per step, through an engine,
and calls its callbacks around every step, in the way OLMo-core's trainer takes callbacks:

    on_start(loop)                 once, before the first step (recording writes config.json and status.json)
    before_step(loop)              evaluations that are due and the target stop (callbacks.Evaluation)
    step_hooks(loop, member)       hooks inside one member's update (the noise scale's), composed in order
    after_step(loop, losses)       divergence, checkpoints, progress
    columns(loop, member)          the columns a callback adds to the history row being written
    on_evaluation(loop, member)    a history row was added (recording rewrites history.csv)
    on_error(loop, member, exc)    an exception ends `member` (state failed or oom), before its on_finish
    on_finish(loop, member)        a member stopped: its results and its run directory
    on_remove(loop, keep)          members left; `keep` are the positions still training
    on_end(loop)                   once, after the last member stopped (not when an exception escapes)
    close(loop)                    always, last, even when an exception escapes the loop: let go of what
                                   the callback holds (a tracker's writer, a progress bar, a lock)

Callbacks run in the order they declare (`Callback.order`, one of the phases of `Order`), callbacks of one
phase in the order they were given (a stable sort): a callback's place in the caller's list no longer
decides, e.g., that checkpoints are written after every other callback's after_step.

A callback owns its state: what it keeps per member lives in the callback, and a callback with a `key`
gives it to every checkpoint (`state_dict(member)`) and takes it back at a resume (`load_state_dict`), so
a resumed run continues each callback exactly. tests/test_loop.py pins this order and a row's columns.

The engine is what trains: engine.ModelEngine (one nn.Module and its optimizer), the device group's engine
or a fused engine (K members stacked into one batched program). The loop owns the rest: the step counter,
which members still train, the budget stop, the clock (training time, evaluation excluded, shared equally
by the members of a step), a history row's core (where training is, the losses, the weights, the time), and
what a failing step means: out of memory and any other exception end the members still training with
state oom or failed, recorded, not raised; only an out-of-memory error in a group that its caller can
split (engine.can_split) is raised, to be split.
"""
from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import torch.nn as nn

from . import schedule
from .config import RunConfig
from .data import Data
from .losses import Task
from .rundir import RunDir
from .runtime import is_out_of_memory, oom_message, synchronize
from .state import TrainState, save_checkpoint
from .step import AfterBackward, Size


@dataclass
class RunResult:
    """What a run ends with: the final state name, metrics and history (also on disk when it has a run_dir)."""
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
        accuracy = bool(rows) and "train_acc" in rows[0]
        lines = [f"{'step':>8} {'epoch':>8} {'lr':>9} {'train_loss':>10} " + (f"{'train_acc':>9} " if accuracy else "")
                 + f"{'test_loss':>9}" + (f" {'test_acc':>8}" if accuracy else "")]
        for r in rows:
            lines.append(f"{int(r['step']):>8d} {float(r['epoch']):>8.2f} {float(r['lr']):>9.3g} "
                         f"{float(r['train_loss']):>10.4f} " + (f"{float(r['train_acc']):>9.4f} " if accuracy else "")
                         + f"{float(r['test_loss']):>9.4f}" + (f" {float(r['test_acc']):>8.4f}" if accuracy else ""))
        m = self.metrics
        lines.append(f"state: {self.state}" + (f" ({self.error})" if self.error else ""))
        if "test_loss" in m:
            shown = (f"test_acc {m['test_acc']:.4f}  gap(acc) {m['gap_acc']:.4f}" if "test_acc" in m else
                     f"test_loss {m['test_loss']:.4g}  (no accuracy: the targets are not class labels)")
            lines.append(f"final: train_loss {m['train_loss']:.4g}  {shown}  steps {m['steps']}  "
                         f"{m['train_seconds']:.1f}s training")
        if self.run_dir:
            lines.append(f"run directory: {self.run_dir}")
        return "\n".join(lines)


@dataclass
class Member:
    """One run in the loop: its config, TrainState, run directory (or None) and how it ended."""
    index: int                      # position in the caller's list of runs
    cfg: RunConfig
    state: TrainState
    rd: RunDir | None
    total: int                      # schedule.total_steps
    evals: set[int]                 # schedule.eval_steps
    resumed_from: int | None = None  # the step a resumable checkpoint brought it to
    wall_offset: float = 0.0        # wall seconds spent before a resume
    restored: dict[str, Any] = field(default_factory=dict, repr=False)  # callbacks' states from that checkpoint
    model_rng: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # and the model's global RNG then
    outcome: str = "ok"
    error: str | None = None
    trace: str | None = None
    measured: dict[str, Any] = field(default_factory=dict)  # measurements at the end, for metrics.json
    result: RunResult | None = field(default=None, repr=False)


@dataclass
class StepHooks:
    """Called inside one member's update: after micro-batch i's backward pass, and before the update."""
    after_backward: AfterBackward | None = None   # (i, micro-batch i's size, the batch's): step.optimizer_update
    before_update: Callable[[], None] | None = None

    @staticmethod
    def compose(hooks: Sequence[StepHooks]) -> StepHooks | None:
        """One StepHooks that calls each of `hooks` in turn (None for none; the one itself for one)."""
        if len(hooks) <= 1:
            return hooks[0] if hooks else None
        backward = [h.after_backward for h in hooks if h.after_backward is not None]
        update = [h.before_update for h in hooks if h.before_update is not None]

        def after_backward(i: int, n_micro: Size, n_batch: Size) -> None:
            for fn in backward:
                fn(i, n_micro, n_batch)

        def before_update() -> None:
            for fn in update:
                fn()
        return StepHooks(after_backward if backward else None, before_update if update else None)


class Engine(Protocol):
    """What trains the members: one optimizer update of each per step, their evaluation, their weights."""
    can_split: bool  # an out-of-memory error with several members is raised, for the caller to split the group

    def step(self, members: list[Member], lrs: list[float], hooks: list[StepHooks | None]) -> torch.Tensor:
        """One update of every member on its own next batch at its lr; advances each member's step and
        examples_seen; returns the batch losses (K,), not synchronised."""

    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        """(mean loss, accuracy or None) of each member on the first `limit` examples of a split."""

    def weight_stats(self, members: list[Member]) -> list[tuple[float, float]]:
        """(L2 distance from the initial weights, L2 norm of the weights) of each member."""

    def remove(self, members: list[Member]) -> None:
        """These members stop: their weights and optimizer state into their TrainState; the engine drops them."""


class Order:
    """The phases a callback declares (Callback.order): the loop calls its callbacks in this order, each
    hook, a phase's callbacks in the order they were given. Why each phase comes where it does:"""
    DECIDE = 100      # Evaluation, Divergence: whether members go on, on the numbers of this step
    SNAPSHOT = 200    # Snapshots: states saved after the evaluation of their step
    MEASURE = 300     # the noise scale, the measurements a config names: numbers the record holds
    PROGRESS = 400    # the progress bar, with the numbers of the evaluation just made
    RECORD = 500      # Recording: the run directory and the member's RunResult, from what came before
    TRACK = 600       # trackers: copies of the record (they read the RunResult Recording made)
    USER = 700        # the default: a user's callback sees the record written
    CHECKPOINT = 900  # last: a checkpoint after a step holds every other callback's state after that step


class Callback:
    """A piece of the loop that differs between paths. Every method does nothing unless overridden.

    `order`: the phase the callback runs in (Order; a user's callback by default after the record is
    written, before checkpoints). `key`: the name under which the callback's per-member state goes into a
    checkpoint (None: it keeps none that must survive a resume); `state_dict(member)` gives that state
    (plain data or tensors, or None), `load_state_dict(member, state)` takes it back before the first step
    of a resumed run. `evaluated_weights(loop, members)`: a context the evaluation's losses are computed in
    (to evaluate other weights than those trained, restored on exit)."""
    order: int = Order.USER
    key: str | None = None

    def on_start(self, loop: Loop) -> None: ...
    def before_step(self, loop: Loop) -> None: ...
    def step_hooks(self, loop: Loop, member: Member) -> StepHooks | None: return None
    def after_step(self, loop: Loop, losses: torch.Tensor) -> None: ...
    def columns(self, loop: Loop, member: Member) -> dict[str, Any]: return {}
    def state_dict(self, member: Member) -> Any: return None
    def load_state_dict(self, member: Member, state: Any) -> None: ...
    def on_evaluation(self, loop: Loop, member: Member) -> None: ...
    def evaluated_weights(self, loop: Loop, members: list[Member]) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()
    def on_error(self, loop: Loop, member: Member, exc: BaseException) -> None: ...
    def on_finish(self, loop: Loop, member: Member) -> None: ...
    def on_remove(self, loop: Loop, keep: torch.Tensor) -> None: ...
    def on_end(self, loop: Loop) -> None: ...
    def close(self, loop: Loop) -> None: ...


CallbackT = TypeVar("CallbackT", bound=Callback)


class Loop:
    """Train `members` with `engine` on `data` (whose targets make `task`), calling `callbacks` in the order
    they declare (Callback.order; those of one phase in the order given)."""

    def __init__(self, members: Sequence[Member], engine: Engine, callbacks: Sequence[Callback], data: Data,
                 task: Task, device: torch.device) -> None:
        self.members, self.active = list(members), list(members)
        self.engine, self.data, self.task, self.device = engine, data, task, device
        self.callbacks = sorted(callbacks, key=lambda cb: cb.order)   # stable: a phase keeps the given order
        keys = [cb.key for cb in self.callbacks if cb.key is not None]
        if len(keys) != len(set(keys)):
            raise ValueError(f"two callbacks keep their state under one key: {sorted(keys)}")
        self.step = self.members[0].state.step if self.members else 0
        self.wall_start = time.perf_counter()
        self._segment_start = 0.0

    # --- the clock: training time between pauses, shared by the members that trained in it
    def _stop_clock(self) -> None:
        synchronize(self.device)
        share = (time.perf_counter() - self._segment_start) / max(1, len(self.active))
        for m in self.active:
            m.state.train_seconds += share

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Time inside is not training time (evaluation, checkpoints, results)."""
        self._stop_clock()
        try:
            yield
        finally:
            self._segment_start = time.perf_counter()

    # --- what every path does the same way
    def evaluate(self, members: list[Member]) -> None:
        """Evaluate `members` now (train loss on eval_train_size examples, test loss), add a history row each."""
        with self.paused():
            cfg = members[0].cfg  # eval_train_size and eval_test_size are equal within a group (fused.compat)
            with contextlib.ExitStack() as weights_evaluated:   # a callback may put other weights in (WeightAverage)
                for cb in self.callbacks:
                    weights_evaluated.enter_context(cb.evaluated_weights(self, members))
                train = self.engine.evaluate(members, "train", cfg.eval_train_size)
                test = self.engine.evaluate(members, "test", cfg.eval_test_size)
            weights = self.engine.weight_stats(members)
            wall = time.perf_counter() - self.wall_start
            for m, tr, te, w in zip(members, train, test, weights):
                m.state.history.append(self.history_row(m, tr, te, w, wall + m.wall_offset))
                for cb in self.callbacks:
                    cb.on_evaluation(self, m)

    def history_row(self, m: Member, train: tuple[float, float | None], test: tuple[float, float | None],
                    weights: tuple[float, float], wall: float) -> dict[str, Any]:
        """One row of history.csv: where training is, train/test loss (and accuracy, bits per character
        where they apply), weight statistics, time, and the noise-scale EMA when it is tracked."""
        cfg, state, task, n_train = m.cfg, m.state, self.task, self.data.n_train
        row: dict[str, Any] = {"step": state.step, "epoch": state.examples_seen / n_train,
                               "examples": state.examples_seen}
        if task.kind == "sequence":
            row["tokens"] = state.examples_seen * task.tokens_per_example
        row["lr"] = schedule.lr_at(cfg, max(state.step - 1, 0), n_train, task.tokens_per_example)
        if cfg.batch_schedule != "constant":
            row["current_batch_size"] = state.indices.size_at(max(state.step - 1, 0))
        for split, (loss, accuracy) in (("train", train), ("test", test)):
            row[f"{split}_loss"] = loss
            if task.accuracy:
                row[f"{split}_acc"] = accuracy
        if task.bits_column:
            row[f"train_{task.bits_column}"], row[f"test_{task.bits_column}"] = task.bits(train[0]), task.bits(test[0])
        row.update(distance_from_init=weights[0], weight_norm=weights[1], train_seconds=state.train_seconds,
                   wall_seconds=wall)
        for cb in self.callbacks:
            row.update(cb.columns(self, m))
        return row

    def callback(self, kind: type[CallbackT]) -> CallbackT:
        """The loop's callback of this class (e.g. loop.callback(NoiseScale) to read a member's EMA)."""
        found = [cb for cb in self.callbacks if isinstance(cb, kind)]
        if len(found) != 1:
            raise LookupError(f"the loop has {len(found)} callbacks of class {kind.__name__}, not one")
        return found[0]

    def callback_states(self, member: Member) -> dict[str, Any]:
        """The state every callback with a key keeps for `member`, by key: what a checkpoint holds besides
        the TrainState."""
        return {cb.key: cb.state_dict(member) for cb in self.callbacks if cb.key is not None}

    def save(self, member: Member, path: Path, resumable: bool) -> None:
        """`member`'s whole state (its TrainState and its callbacks' states) to a checkpoint file at `path`."""
        save_checkpoint(path, member.cfg, member.state, resumable, self.callback_states(member))

    def stop(self, members: list[Member]) -> None:
        """`members` stop (each with its outcome set): the engine gives back their state, callbacks finish them."""
        with self.paused():
            try:
                self.engine.remove(members)
            except Exception:  # noqa: BLE001 - after a failure the weights may be what failed; the record matters more
                if all(m.outcome == "ok" for m in members):
                    raise
            for m in members:
                for cb in self.callbacks:
                    cb.on_finish(self, m)
            gone = {id(m) for m in members}
            keep = [r for r, m in enumerate(self.active) if id(m) not in gone]
            self.active = [self.active[r] for r in keep]
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            for cb in self.callbacks:
                cb.on_remove(self, index)

    def _hooks(self, member: Member) -> StepHooks | None:
        """Every callback's hooks into `member`'s update this step, composed in the callbacks' order."""
        return StepHooks.compose([h for cb in self.callbacks if (h := cb.step_hooks(self, member)) is not None])

    # --- the loop
    def run(self) -> list[Member]:
        """Train until every member has stopped; returns the members (each with its result). Every callback's
        close runs at the end, whatever happened (a close that raises does not keep the others from theirs)."""
        try:
            for m in self.members:   # a resumed member's callbacks continue where they were
                for cb in self.callbacks:
                    if cb.key is not None and m.restored.get(cb.key) is not None:
                        cb.load_state_dict(m, m.restored[cb.key])
            for cb in self.callbacks:
                cb.on_start(self)
            self._train()
            for cb in self.callbacks:
                cb.on_end(self)
        except BaseException:
            self._close(raise_first=False)   # the exception on its way out is the one to see
            raise
        self._close(raise_first=True)
        return self.members

    def _close(self, raise_first: bool) -> None:
        """Every callback's close; with `raise_first`, the first error a close raised, after all have run."""
        failed: Exception | None = None
        for cb in self.callbacks:
            try:
                cb.close(self)
            except Exception as exc:  # noqa: BLE001 - the others close all the same
                failed = failed or exc
        if failed is not None and raise_first:
            raise failed

    def _train(self) -> None:
        """The steps, until no member is active; a failure ends the active members with its state."""
        synchronize(self.device)
        self._segment_start = time.perf_counter()
        try:
            while self.active:
                for cb in self.callbacks:
                    cb.before_step(self)
                done = [m for m in self.active if m.state.step >= m.total]
                if done:
                    self.stop(done)
                if not self.active:
                    break
                n_train, tokens = self.data.n_train, self.task.tokens_per_example
                lrs = [schedule.lr_at(m.cfg, m.state.step, n_train, tokens) for m in self.active]
                losses = self.engine.step(self.active, lrs, [self._hooks(m) for m in self.active])
                self.step += 1
                for cb in self.callbacks:
                    cb.after_step(self, losses)
        except Exception as exc:  # noqa: BLE001 - recorded per member, the caller (a sweep) carries on
            if is_out_of_memory(exc) and self.engine.can_split and len(self.active) > 1:
                raise
            if is_out_of_memory(exc):
                outcome, error, trace = "oom", f"out of memory at step {self.step}: {oom_message(exc)}", None
            else:
                outcome, error, trace = "failed", f"{type(exc).__name__}: {exc}", traceback.format_exc()
            for m in self.active:
                m.outcome, m.error, m.trace = outcome, error, trace
                for cb in self.callbacks:
                    cb.on_error(self, m, exc)
            if self.active:
                self.stop(list(self.active))
