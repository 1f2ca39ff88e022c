"""Fused training: K runs of one shape trained as one batched program, each member as if run alone.

`train_group(cfgs, run_dirs)` gives every member exactly what `train.run(cfg, run_dir)` gives it:
its own initial weights (train.new_state, its own init generator), its own data order (its own
BatchSampler and data generator; batches gathered per member), its own lr at every step
(config.lr_at), its own optimizer hyperparameters, evaluation schedule, budget and divergence check.
Members move in lockstep; a member that reaches its target, diverges, fails or exhausts its budget
stops, its run directory is written then (every file atomically, through RunDir), and the stack is
compacted to the members still training.

Differences from train.run, by design: `train_seconds` of a member is its share of the fused steps'
time (each step's time divided by the members in it), so the members' times add up to the group's;
no resumable checkpoints (checkpoint_every is not fusable); status.json carries `group`.
Numbers agree with separate runs to float32 rounding (batched kernels sum in another order).
"""
from __future__ import annotations

import math
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .. import config as C
from ..config import ConfigError, RunConfig
from ..data import Dataset, dataset_for
from ..rundir import RunDir
from ..runtime import check_precision, provenance, resolve_device, set_threads, synchronize
from ..train import (
    EVAL_CHUNK,
    LOSS_CHECK_EVERY,
    RunResult,
    TrainState,
    _final_metrics,
    _progress_bar,
    new_state,
    save_checkpoint,
)
from .compat import fusion_blocker
from .layers import StackedModel
from .memory import cuda_group_size
from .optim import FusedOptimizer

EVAL_MEMBER_EXAMPLES = 8 * EVAL_CHUNK  # members x examples per batched evaluation forward pass
CPU_PASS_EXAMPLES = 1024  # members x examples per training forward/backward pass on the CPU (cache-sized)


@dataclass
class Member:
    """One run inside a group: its config, run directory, TrainState (model, sampler, generators) and fate."""
    index: int                      # position in train_group's cfgs
    cfg: RunConfig
    rd: RunDir | None
    state: TrainState
    total: int                      # config.total_steps
    evals: set[int]                 # config.eval_steps
    last_checked: int = 0           # the step up to which batch losses were checked for divergence
    outcome: str = "ok"
    error: str | None = None
    trace: str | None = None
    result: RunResult | None = field(default=None, repr=False)


def train_group(cfgs: Sequence[RunConfig], run_dirs: Sequence[str | Path | None] | None = None,
                progress: bool | None = None, group_id: str | None = None) -> list[RunResult]:
    """Train every config in `cfgs` together; per member the same result as `train.run(cfg, run_dir)`.

    All configs must be fusable with the first (fusion_blocker), else ConfigError before any work.
    Finished run directories are returned as they are. On CUDA the group is first cut to the size the
    memory model allows (fused/memory.py); an out-of-memory error splits a group in two and retrains its
    unfinished members from scratch (their results do not change).
    """
    cfgs = list(cfgs)
    if not cfgs:
        return []
    dirs = list(run_dirs) if run_dirs is not None else [None] * len(cfgs)
    if len(dirs) != len(cfgs):
        raise ConfigError(f"train_group: {len(cfgs)} configs but {len(dirs)} run directories")
    for i, cfg in enumerate(cfgs):
        reason = fusion_blocker(cfgs[0], cfg)
        if reason:
            raise ConfigError(f"train_group: config {i} cannot join config 0's group: {reason}")

    results: list[RunResult | None] = [None] * len(cfgs)
    todo = []
    for i, d in enumerate(dirs):
        rd = RunDir(d) if d is not None else None
        if rd and rd.is_finished():
            results[i] = RunResult(str(rd.state()), rd.metrics(), rd.history_rows(), rd.path)
        else:
            todo.append(i)
    if not todo:
        return [r for r in results if r is not None]

    # --- setup: everything that can be wrong with the input fails here, before any training
    cfg0 = cfgs[todo[0]]
    device = resolve_device(cfg0.device)
    check_precision(cfg0.precision, device)
    set_threads(cfg0.threads)
    data = dataset_for(cfg0, device)
    for i in todo:
        C.check_batch_fits(cfgs[i], data.n_train)
    if cfg0.eval_train_size and cfg0.eval_train_size > data.n_train:
        raise ConfigError(f"eval_train_size {cfg0.eval_train_size} exceeds the training set size {data.n_train}")

    limit = cuda_group_size(cfg0, device) or len(todo)  # on CUDA, from the memory model
    queue = [todo[i:i + limit] for i in range(0, len(todo), limit)]
    while queue:
        group = queue.pop(0)
        members = [_new_member(i, cfgs[i], dirs[i], data, device, group_id) for i in group]
        retry = _train_fused(members, data, device, progress, group_id)
        if retry:  # out of memory with more than one member: halve and start those members again
            half = len(retry) // 2
            queue[:0] = [retry[:half], retry[half:]]
        for m in members:
            if m.result is not None:
                results[m.index] = m.result
    return [r for r in results if r is not None]


def _new_member(index: int, cfg: RunConfig, run_dir: str | Path | None, data: Dataset, device: torch.device,
                group_id: str | None) -> Member:
    n_train = data.n_train
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd:
        rd.write_config(cfg.to_dict(), C.derived(cfg, n_train))
        rd.write_status("running", started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), resumed_from=None,
                        error=None, traceback=None, provenance=provenance(device), group=group_id)
    return Member(index, cfg, rd, new_state(cfg, data, device), C.total_steps(cfg, n_train),
                  set(C.eval_steps(cfg, n_train)))


class _Stack:
    """The trainable state of the members still training: flat parameters, BatchNorm buffers, optimizer."""

    def __init__(self, members: list[Member], data: Dataset, device: torch.device):
        self.model = StackedModel(members[0].state.model, data.input_shape)
        flat, self.buffers = self.model.stack([m.state.model for m in members], device)
        self.initial = flat.clone()
        self.flat = flat.requires_grad_(True)
        self.optimizer = FusedOptimizer.for_members([m.cfg for m in members], flat)

    def keep(self, index: torch.Tensor) -> None:
        self.flat = self.flat.detach()[index].requires_grad_(True)
        self.initial = self.initial[index]
        self.buffers = {key: [t[index] for t in stats] for key, stats in self.buffers.items()}
        self.optimizer.keep(index)

    def step(self, members: list[Member], data: Dataset, micro_batch_size: int | None,
             lr: torch.Tensor) -> torch.Tensor:
        """One optimizer update of every member on its own next batch; the members' batch losses (K,).

        On the CPU the forward/backward passes go over consecutive slices of the members, at most
        CPU_PASS_EXAMPLES examples each (activations stay in cache); the update is one for all members.
        """
        k = len(members)
        idx = torch.stack([m.state.sampler.next() for m in members])          # (K, B)
        micro_batches = idx.split(micro_batch_size, dim=1) if micro_batch_size else (idx,)
        per_pass = k
        if self.flat.device.type == "cpu":
            per_pass = max(1, CPU_PASS_EXAMPLES // micro_batches[0].shape[1])
        self.flat.grad = None
        total = torch.zeros(k, device=self.flat.device)
        for lo in range(0, k, per_pass):
            n = min(per_pass, k - lo)
            flat = self.flat if n == k else self.flat.narrow(0, lo, n)
            buffers = {key: [t.narrow(0, lo, n) for t in stats] for key, stats in self.buffers.items()}
            for micro in micro_batches:
                micro = micro[lo:lo + n]
                logits = self.model.forward(flat, buffers, data.x_train[micro], training=True)
                # classes as dim 1: log_softmax then runs along the batch, much faster than over 10 classes
                loss = F.cross_entropy(logits.transpose(1, 2), data.y_train[micro], reduction="none").mean(1)
                if len(micro_batches) > 1:
                    loss = loss * (micro.shape[1] / idx.shape[1])
                loss.sum().backward()
                total[lo:lo + n] += loss.detach()
        assert self.flat.grad is not None
        self.optimizer.update(self.flat, self.flat.grad, lr)
        return total

    @torch.no_grad()
    def evaluate(self, rows: list[int], x: torch.Tensor, y: torch.Tensor) -> list[tuple[float, float]]:
        """(mean cross-entropy, accuracy) on (x, y) of the members at `rows`, eval-mode BatchNorm."""
        loss_sum = torch.zeros(len(rows), dtype=torch.float64, device=x.device)
        correct = torch.zeros(len(rows), dtype=torch.int64, device=x.device)
        per_pass = max(1, EVAL_MEMBER_EXAMPLES // EVAL_CHUNK)
        for lo in range(0, len(rows), per_pass):
            index = torch.tensor(rows[lo:lo + per_pass], device=x.device)
            flat = self.flat.detach()[index]
            buffers = {key: [t[index] for t in stats] for key, stats in self.buffers.items()}
            for start in range(0, len(x), EVAL_CHUNK):
                xb, yb = x[start:start + EVAL_CHUNK], y[start:start + EVAL_CHUNK]
                logits = self.model.forward(flat, buffers, xb, training=False)        # (k, n, classes)
                ce = F.cross_entropy(logits.transpose(1, 2), yb.expand(len(index), -1), reduction="none")
                loss_sum[lo:lo + len(index)] += ce.sum(1).double()
                correct[lo:lo + len(index)] += (logits.argmax(-1) == yb).sum(1)
        return [(s / len(x), c / len(x)) for s, c in zip(loss_sum.tolist(), correct.tolist())]

    @torch.no_grad()
    def weight_stats(self, rows: list[int]) -> list[tuple[float, float]]:
        """(L2 distance from the initial weights, L2 norm of the weights) of the members at `rows`."""
        index = torch.tensor(rows, device=self.flat.device)
        flat = self.flat.detach()[index]
        distance = ((flat - self.initial[index]) ** 2).sum(1).sqrt()
        norm = (flat ** 2).sum(1).sqrt()
        return list(zip(distance.tolist(), norm.tolist()))

    @torch.no_grad()
    def unstack(self, member: Member, row: int) -> None:
        """Write row `row` (weights, BatchNorm statistics, optimizer state) into the member's TrainState."""
        state, cfg = member.state, member.cfg
        self.model.load_member(state.model, self.flat.detach(), self.buffers, row)
        opt = self.optimizer
        firsts = self.model.rows_to_torch(opt.buf[row:row + 1])
        seconds = self.model.rows_to_torch(opt.sq[row:row + 1]) if opt.sq is not None else [None] * len(firsts)
        params = dict(state.model.named_parameters())
        torch_opt = state.optimizer
        for slot, first, second in zip(self.model.slots, firsts, seconds):
            p = params[slot.name]
            if opt.kind == "sgd":
                if cfg.momentum != 0 and opt.step > 0:
                    torch_opt.state[p] = {"momentum_buffer": first[0].clone()}
            elif opt.step > 0:
                assert second is not None
                torch_opt.state[p] = {"step": torch.tensor(float(opt.step)), "exp_avg": first[0].clone(),
                                      "exp_avg_sq": second[0].clone()}
        if state.step > 0:
            for group in torch_opt.param_groups:
                group["lr"] = C.lr_at(cfg, state.step - 1, state.sampler.n)


def _train_fused(members: list[Member], data: Dataset, device: torch.device, progress: bool | None,
                 group_id: str | None) -> list[int]:
    """Train `members` together, finishing each (m.result) when it stops.

    Returns the indices of unfinished members to retry in smaller groups after an out-of-memory error
    (empty otherwise).
    """
    n_train = data.n_train
    cfg0 = members[0].cfg
    check_every = LOSS_CHECK_EVERY.get(device.type, 1)
    active = list(members)
    step = 0
    pending: list[torch.Tensor] = []  # batch losses (K_active,) of recent steps, not yet checked by everyone
    try:
        stack = _Stack(members, data, device)
    except torch.OutOfMemoryError as exc:
        if len(members) > 1:
            return _release_for_retry(members, device)
        members[0].outcome, members[0].error = "oom", f"out of memory at step 0: {str(exc).splitlines()[0]}"
        _finish_member(members[0], data, group_id)
        return []
    bar = _progress_bar(max(m.total for m in members), progress)
    wall_start = time.perf_counter()
    synchronize(device)
    segment_start = time.perf_counter()

    def stop_clock() -> None:
        nonlocal segment_start
        synchronize(device)
        share = (time.perf_counter() - segment_start) / max(1, len(active))
        for m in active:
            m.state.train_seconds += share
        segment_start = time.perf_counter()

    def record_evaluations(rows: list[int]) -> None:
        nonlocal segment_start
        stop_clock()
        n_eval = cfg0.eval_train_size or n_train
        train = stack.evaluate(rows, data.x_train[:n_eval], data.y_train[:n_eval])
        test = stack.evaluate(rows, data.x_test, data.y_test)
        weights = stack.weight_stats(rows)
        wall = time.perf_counter() - wall_start
        for r, (train_loss, train_acc), (test_loss, test_acc), (distance, norm) in zip(rows, train, test, weights):
            m = active[r]
            m.state.history.append({
                "step": m.state.step, "epoch": m.state.examples_seen / n_train, "examples": m.state.examples_seen,
                "lr": C.lr_at(m.cfg, max(m.state.step - 1, 0), n_train),
                "train_loss": train_loss, "train_acc": train_acc, "test_loss": test_loss, "test_acc": test_acc,
                "distance_from_init": distance, "weight_norm": norm,
                "train_seconds": m.state.train_seconds, "wall_seconds": wall})
            if m.rd:
                m.rd.write_history(m.state.history)
        segment_start = time.perf_counter()

    def finish(rows: list[int]) -> None:
        """Write the stopped members' results, then drop them from the stack."""
        nonlocal active, pending, segment_start
        stop_clock()
        for r in rows:
            stack.unstack(active[r], r)
            _finish_member(active[r], data, group_id)
        keep = [r for r in range(len(active)) if r not in set(rows)]
        index = torch.tensor(keep, dtype=torch.long, device=device)
        stack.keep(index)
        pending = [p[index] for p in pending]
        active = [active[r] for r in keep]
        segment_start = time.perf_counter()  # writing results and measuring is not training time

    try:
        while active:
            due = [r for r, m in enumerate(active)
                   if step in m.evals and not (m.state.history and m.state.history[-1]["step"] == step)]
            if due:
                record_evaluations(due)
            done = [r for r, m in enumerate(active)
                    if step >= m.total or (r in due and m.cfg.budget == "target"
                                           and m.state.history[-1]["train_loss"] <= m.cfg.target_loss)]
            if done:
                finish(done)
            if not active:
                break

            lr = torch.tensor([C.lr_at(m.cfg, step, n_train) for m in active], device=device).view(-1, 1)
            pending.append(stack.step(active, data, cfg0.micro_batch_size, lr))
            step += 1
            for m in active:
                m.state.step = step
                m.state.examples_seen += cfg0.batch_size
            bar.update(1)
            closing = [r for r, m in enumerate(active)
                       if step - m.last_checked >= check_every or step in m.evals or step >= m.total]
            if closing:
                losses = torch.stack(pending).tolist()  # (steps, K_active)
                diverged = []
                for r in closing:
                    m = active[r]
                    mine = [row[r] for row in losses[len(losses) - (step - m.last_checked):]]
                    m.last_checked = step
                    if m.state.first_loss is None:
                        m.state.first_loss = mine[0]
                    bad = next((x for x in mine
                                if not math.isfinite(x) or x > m.cfg.divergence_ratio * m.state.first_loss), None)
                    if bad is not None:
                        m.outcome = "diverged"
                        m.error = (f"batch loss {bad:.4g} by step {step} "
                                   f"(first batch loss {m.state.first_loss:.4g})")
                        diverged.append(r)
                oldest = min(m.last_checked for m in active)
                pending = pending[len(pending) - (step - oldest):] if step > oldest else []
                if diverged:
                    record_evaluations(diverged)
                    finish(diverged)
    except torch.OutOfMemoryError as exc:
        if len(active) > 1:
            del stack
            return _release_for_retry(active, device)
        _fail(active, stack, data, group_id, "oom",
              f"out of memory at step {active[0].state.step}: {str(exc).splitlines()[0]}", None)
    except Exception as exc:  # noqa: BLE001 - recorded per member, the caller (a sweep) carries on
        _fail(active, stack, data, group_id, "failed", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    finally:
        bar.close()
    return []


def _release_for_retry(members: list[Member], device: torch.device) -> list[int]:
    """The members to train again in smaller groups, after freeing what the allocator caches."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return [m.index for m in members]


def _fail(active: list[Member], stack: _Stack, data: Dataset, group_id: str | None, outcome: str, error: str,
          trace: str | None) -> None:
    """Record `outcome` (oom or failed) for every member still training, with its weights when readable."""
    for r, m in enumerate(active):
        m.outcome, m.error, m.trace = outcome, error, trace
        try:
            stack.unstack(m, r)
        except Exception:  # noqa: BLE001 - the weights may be what failed; the record matters more
            pass
        _finish_member(m, data, group_id)


def _finish_member(m: Member, data: Dataset, group_id: str | None) -> None:
    """Final metrics, measurements and the run directory of a stopped member, as train.run writes them."""
    cfg, state, rd = m.cfg, m.state, m.rd
    metrics: dict[str, Any] = _final_metrics(cfg, state, state.history, data.n_train) if state.history else {}
    if m.outcome == "ok" and cfg.measure:
        from ..measure import take_measurements
        metrics.update(take_measurements(cfg.measure, state.model, data, cfg, state.generators.probe))
    if rd:
        rd.write_history(state.history)
        rd.write_metrics(metrics)
        if m.outcome not in ("oom", "failed") and cfg.save_checkpoint:
            save_checkpoint(rd.checkpoint_path, cfg, state, resumable=False)
        elif m.outcome not in ("oom", "failed") and rd.checkpoint_path.exists():
            rd.checkpoint_path.unlink()
        rd.write_status(m.outcome, error=m.error, traceback=m.trace, group=group_id)
    m.result = RunResult(m.outcome, metrics, state.history, rd.path if rd else None, m.error, state.model)
