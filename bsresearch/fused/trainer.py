"""Fused training: K runs of one shape trained as one batched program, each member as if run alone.

`train_group(cfgs, run_dirs)` gives every member exactly what `train.run(cfg, run_dir)` gives it, through
the same training loop (loop.py) and callbacks: its own initial weights (state.new_state, its own init
generator), its own data order (its own BatchSampler and data generator; batches gathered per member),
its own lr at every step (schedule.lr_at), its own optimizer hyperparameters, evaluation schedule, budget
and divergence check. What is fused is the loop's engine (fused/engine.py): the members' parameters
stacked into one (K, P) tensor, one batched forward and backward pass (the built-in models' batched layers,
fused/engine.py's `StackEngine`, or any other model through torch.func.vmap, `VmapEngine`), one optimizer
update for all (fused/optim.py). A member that stops has its row written back into its own TrainState (weights,
BatchNorm statistics, optimizer state) and leaves the stack.

Out of memory: `train_group` trains its members in chunks, on CUDA of the size the memory model allows
(fused/memory.py), and keeps the one queue of them. A chunk of several members that runs out of memory is
split in two and its unfinished members start again from scratch (their results do not change); a member
alone that runs out of memory ends with state "oom", recorded in its status.json as train.run records it,
never raised. Finished members keep their results.

Differences from train.run, by design: `train_seconds` of a member is its share of the fused steps'
time (each step's time divided by the members in it), so the members' times add up to the group's;
no resumable checkpoints (checkpoint_every is not fusable); status.json carries `group`.
Numbers agree with separate runs to float32 rounding (batched kernels sum in another order).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .. import schedule
from ..config import ConfigError, RunConfig
from ..data import Dataset
from ..driver import Place, before_any_work, callbacks_for, setup_out_of_memory
from ..engine import ModelEngine
from ..loop import Member, RunResult, StepHooks
from ..models import model_for
from ..rundir import RunDir
from ..runsetup import RunSetup, run_setup
from ..runtime import is_out_of_memory, oom_message, resolve_device
from ..train import run
from . import generic
from .compat import STACKED_MODELS, fusion_blocker
from .engine import FusedEngine, StackEngine, VmapEngine
from .grouping import CPU_FUSE_MAX_BATCH_OTHER, residency, resident_bytes
from .memory import cuda_group_size


def train_group(cfgs: Sequence[RunConfig], run_dirs: Sequence[str | Path | None] | None = None,
                progress: bool | None = None, group_id: str | None = None) -> list[RunResult]:
    """Train every config in `cfgs` together; per member the same result as `train.run(cfg, run_dir)`.

    All configs must be fusable with the first (fusion_blocker), else ConfigError before any work.
    Finished run directories are returned as they are. On CUDA the group is first cut to the size the
    memory model allows (fused/memory.py); an out-of-memory error splits a chunk in two and retrains its
    unfinished members from scratch (their results do not change), down to single members, whose "oom" is
    their result (module docstring). Running out of memory in the setup (the data or the model on the
    device) is every unfinished member's "oom", as it is a run's in train.run.
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
    results: list[RunResult | None] = [before_any_work(cfg, d) for cfg, d in zip(cfgs, dirs)]
    todo = [i for i, r in enumerate(results) if r is None]
    if not todo:
        return [r for r in results if r is not None]
    try:
        _train(cfgs, dirs, todo, results, progress, group_id)
    except Exception as exc:   # the data or the first model did not fit on the device
        if not is_out_of_memory(exc):
            raise
        device = resolve_device(cfgs[todo[0]].device)
        for i in todo:
            if results[i] is None:
                results[i] = setup_out_of_memory(cfgs[i], dirs[i], Place.member(group_id), device, oom_message(exc))
    return [r for r in results if r is not None]


def _train(cfgs: list[RunConfig], dirs: Sequence[str | Path | None], todo: list[int], results: list[RunResult | None],
           progress: bool | None, group_id: str | None) -> None:
    """train_group's members `todo` (indices into cfgs and dirs), each result into `results`."""
    # --- setup: everything that can be wrong with the input fails here, before any training
    cfg0 = cfgs[todo[0]]
    parts = run_setup(cfg0)
    if not isinstance(parts.data, Dataset):  # a map-style Dataset the sweep's planner could not see (a remote
        fits, why = residency(resident_bytes(parts.data))  # cluster), or a caller's own group
        if not fits:
            for i in todo:
                results[i] = _alone(cfgs[i], dirs[i], progress, why)
            return
        parts = run_setup(cfg0.replace(data_loading="resident"))
    data, device = parts.data, parts.device
    assert isinstance(data, Dataset)
    for i in todo:
        schedule.check_data_size(cfgs[i], data.n_train)
    stacked = cfg0.model in STACKED_MODELS and cfg0.loss == "cross_entropy"   # fused/layers.py's own program
    reason = None if stacked else generic.probe(model_for(cfg0, data, torch.Generator().manual_seed(0)).to(device),
                                                *data.first(min(2, data.n_train)), parts.loss)
    if reason is None and len(todo) > 1 and _calibrated(cfg0, stacked, device):
        try:
            ratio = calibrate_group([cfgs[i] for i in todo], data, device, parts, stacked)
        except Exception:  # noqa: BLE001 - the group's own steps meet the same error, and the loop records it per member
            ratio = generic.PAYS
        if ratio < generic.PAYS:
            reason = (f"fusing does not pay here: {ratio:.2f}x per member in a calibration of "
                      f"{generic.CALIBRATION_STEPS} interleaved rounds")
    if reason is not None:  # each member trains alone, as train.run trains it, and its status says why
        for i in todo:
            results[i] = _alone(cfgs[i], dirs[i], progress, reason)
        return

    # --- the queue: chunks of the members, each trained fused; a chunk that runs out of memory is halved
    limit = cuda_group_size(cfg0, device) or len(todo)  # on CUDA, from the memory model
    queue = [todo[i:i + limit] for i in range(0, len(todo), limit)]
    while queue:
        chunk = queue.pop(0)
        members: list[Member] = []
        retry: list[int] = []
        message = ""
        try:
            for i in chunk:
                members.append(parts.member(i, cfgs[i], dirs[i], resume=False))
            _train_fused(members, data, device, progress, group_id, parts, stacked)
        except Exception as exc:   # the loop raises out of memory only while several members train
            if not is_out_of_memory(exc):
                raise
            done = {m.index for m in members if m.result is not None}
            retry = [i for i in chunk if i not in done]
            message = oom_message(exc)   # not the error: its traceback holds the chunk's tensors
        for m in members:
            if m.result is not None:
                results[m.index] = m.result
        if not retry:
            continue
        members = []   # the states of the chunk that did not fit, freed before its halves start
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if len(retry) > 1:   # halve, and start those members again
            half = len(retry) // 2
            queue[:0] = [retry[:half], retry[half:]]
        else:   # a member alone whose model did not fit on the device: its result, as in train.run
            results[retry[0]] = setup_out_of_memory(cfgs[retry[0]], dirs[retry[0]], Place.member(group_id), device,
                                                    message)


def _alone(cfg: RunConfig, run_dir: str | Path | None, progress: bool | None, reason: str) -> RunResult:
    """A member of a group that cannot fuse, trained alone by train.run; its status.json records why."""
    result = run(cfg, run_dir, progress=progress)
    if run_dir is not None:
        RunDir(run_dir).write_status(result.state, fusion=reason)
    return result


def _calibrated(cfg: RunConfig, stacked: bool, device: torch.device) -> bool:
    """Whether a group is fused only after a calibration says it pays here: every group through vmap; a group
    of the stacked layers on a CPU above batch 64, where the gain is smaller and depends on the machine
    (grouping.CPU_FUSE_MAX_BATCH). Not on CUDA, where the stacked group is sized by its memory model and
    copies for a calibration would double it."""
    return not stacked or (device.type == "cpu" and cfg.batch_size > CPU_FUSE_MAX_BATCH_OTHER)


def calibrate_group(cfgs: list[RunConfig], data: Dataset, device: torch.device, parts: RunSetup,
                    stacked: bool = False) -> float:
    """The fused step's speed-up per member for this group (train_group fuses it at generic.PAYS or more):
    generic.calibrate on fresh copies of the group's members (their training is untouched), fused by the
    engine the group would train with."""
    copies = [parts.member(i, cfg) for i, cfg in enumerate(cfgs)]
    engine: FusedEngine = StackEngine(copies, data, device) if stacked else \
        VmapEngine(copies, data, parts.loss, parts.task, device)
    lrs = [schedule.lr_at(m.cfg, 0, data.n_train) for m in copies]
    alone = ModelEngine(data, parts.loss, parts.task)
    loners = [parts.member(i, cfg) for i, cfg in enumerate(cfgs)]
    def fused() -> object:
        return engine.step(copies, lrs, [None] * len(copies))

    def one(member: Member, lr: float) -> Callable[[], object]:
        return lambda: alone.step([member], [lr], [None])
    return generic.calibrate(fused, [one(m, lr) for m, lr in zip(loners, lrs)], device)


def _train_fused(members: list[Member], data: Dataset, device: torch.device, progress: bool | None,
                 group_id: str | None, parts: RunSetup, stacked: bool) -> None:
    """Train `members` together with the one training loop, each member's result in m.result. An
    out-of-memory error with more than one member still training is raised, for train_group's queue to split."""
    engine: FusedEngine | _OutOfMemory
    try:
        engine = StackEngine(members, data, device) if stacked else \
            VmapEngine(members, data, parts.loss, parts.task, device)
    except Exception as exc:
        if len(members) > 1 or not is_out_of_memory(exc):
            raise
        engine = _OutOfMemory(exc)  # the stack of one did not fit: the loop records oom, as train.run would
    parts.loop(members, engine, callbacks_for(Place.member(group_id), [m.cfg for m in members], progress)).run()


class _OutOfMemory:
    """The engine of a member whose stack did not fit in memory: whatever the loop asks raises that error."""
    can_split = False

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def step(self, members: list[Member], lrs: list[float], hooks: list[StepHooks | None]) -> torch.Tensor:
        raise self.exc

    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        raise self.exc

    def weight_stats(self, members: list[Member]) -> list[tuple[float, float]]:
        raise self.exc

    def remove(self, members: list[Member]) -> None:
        pass
