"""A run's schedule: every number that follows from its config and its data, in one place.

The config says what a run is (config.py: its fields, their vocabulary and validation); this module turns it,
with the training set's size (n_train) and the examples' tokens (tokens_per_example, from the task), into
the numbers training follows: the lr at each step (scaled by the batch-size rule, warmed up, scheduled),
the batch size at each step (a batch schedule's phases), the step budget, the evaluation and snapshot
steps, and the derived values written beside the config in config.json. Durations in epochs, examples or
tokens become steps here and nowhere else. No torch import.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

from .config import (
    REFERENCE_FIELDS,
    ConfigError,
    RunConfig,
    accumulation_steps,
    batch_sizes_of,
    bn_batches,
    device_batches,
    is_reference,
    per_device_statistics,
    phase_batch_size,
    reference_sources,
    run_id,
    trajectory_key,
)


def scale_lr(lr: float, base_batch_size: int, batch_size: int, rule: str) -> float:
    """The lr at batch_size from lr at base_batch_size: x ratio (linear), x sqrt(ratio) (sqrt), as is (none)."""
    ratio = batch_size / base_batch_size
    return lr * {"none": 1.0, "linear": ratio, "sqrt": ratio ** 0.5}[rule]


def scaled_lr(cfg: RunConfig) -> float:
    """Learning rate actually used, from the base lr and the batch-size scaling rule."""
    return scale_lr(cfg.lr, cfg.base_batch_size, cfg.batch_size, cfg.lr_scaling)


def adam_beta2_at(cfg: RunConfig, batch_size: int) -> float:
    """Adam's beta2 for an update of `batch_size` examples: adam_beta2, or with beta2_scaling half_life
    adam_beta2 ** (batch_size / base_batch_size), so that the second-moment average forgets half its weight
    after the same number of examples (tokens) at every batch size (Marek et al. 2025)."""
    if cfg.beta2_scaling == "half_life":
        return cfg.adam_beta2 ** (batch_size / cfg.base_batch_size)
    return cfg.adam_beta2


def bn_statistics_batch(cfg: RunConfig) -> int | None:
    """Examples each BatchNorm statistic is computed over in training (None without BatchNorm).

    Micro-batching changes this (statistics come from each micro-batch); ghost batches make it smaller still.
    """
    if not cfg.batchnorm:
        return None
    size = device_batches(cfg)[0] if per_device_statistics(cfg) else cfg.micro_batch_size or cfg.batch_size
    return min(size, cfg.ghost_batch_size) if cfg.ghost_batch_size else size


def device_values(cfg: RunConfig) -> dict[str, Any]:
    """A run on several devices, in config.json: the devices, the per-device batch (batch_size / (devices x
    accumulation steps), examples one device runs at once; a list along a batch schedule), the micro-batch
    (examples of one accumulation step over all devices), and where BatchNorm takes its statistics
    (per_device: each device's share, a ghost batch; global: all devices together). {} on one device."""
    if cfg.devices == 1:
        return {}
    shares = device_batches(cfg)
    return {"devices": cfg.devices, "per_device_batch": shares[0] if len(set(shares)) == 1 else list(shares),
            "micro_batch": cfg.micro_batch_size or cfg.batch_size,
            "batchnorm_statistics": None if not cfg.batchnorm else "per_device" if per_device_statistics(cfg)
            else "global"}


def steps_per_epoch(cfg: RunConfig, n_train: int) -> int:
    """Optimizer updates per pass over the training set at the (initial) batch size; the last partial
    batch is dropped."""
    check_batch_fits(cfg, n_train)
    return n_train // cfg.batch_size


def batch_phases(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> list[tuple[int, int]]:
    """(first step, batch size) of each phase of the batch schedule; one phase for a constant batch.

    batch_schedule=step (Smith, Kindermans, Ying & Le 2018: increase the batch instead of decaying the lr):
    at each milestone of lr_decay_at, a fraction of the budget in epochs, the batch size multiplies by
    batch_growth. A phase runs until the epochs done (each step of batch B counting 1/(n_train // B) of an
    epoch, as with a constant batch) reach its milestone, rounded up to whole steps.

    batch_schedule=tokens (batch-size warmup, and branches into larger batches; Merrill et al. 2025): the
    batch is batch_size until batch_at_tokens[0] tokens have been trained, then batch_sizes[0] until
    batch_at_tokens[1], and so on to the budget in tokens; each phase rounds up to whole steps, and the lr
    follows lr_scaling at each phase's batch size.
    """
    return [(start, size) for start, size, _ in _phase_steps(cfg, n_train, tokens_per_example)]


@functools.lru_cache(maxsize=256)  # the training loop asks at every step; a config is frozen and hashable
def _phase_steps(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> tuple[tuple[int, int, int], ...]:
    """(first step, batch size, steps) of each phase of the batch schedule."""
    if cfg.batch_schedule == "constant":
        return ((0, cfg.batch_size, 0),)
    check_batch_fits(cfg, n_train)
    if cfg.batch_schedule == "tokens":
        out, start, done = [], 0, 0.0
        for size, bound in zip((cfg.batch_size, *cfg.batch_sizes), (*cfg.batch_at_tokens, cfg.budget_amount)):
            per_step = size * tokens_per_example
            steps = max(0, math.ceil(round((bound - done) / per_step, 9)))
            out.append((start, size, steps))
            start, done = start + steps, done + steps * per_step
        return tuple(out)
    bounds = [*cfg.lr_decay_at, 1.0]
    phases, start, epochs_done = [], 0, 0.0
    for k, bound in enumerate(bounds):
        size = phase_batch_size(cfg, k)
        per_epoch = n_train // size
        steps = max(0, math.ceil(round((bound * cfg.budget_amount - epochs_done) * per_epoch, 9)))
        phases.append((start, size, steps))
        start, epochs_done = start + steps, epochs_done + steps / per_epoch
    return tuple(phases)


def batch_size_at(cfg: RunConfig, step: int, n_train: int, tokens_per_example: int = 1) -> int:
    """Examples in the update that follows `step` completed updates (the batch schedule's phase)."""
    return next(size for start, size, _ in reversed(_phase_steps(cfg, n_train, tokens_per_example))
                if step >= start)


def total_steps(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> int:
    """The step budget: the one place where epochs, examples, tokens or a target become a number of steps.

    For budget=target this is the cap (max_steps); the run stops earlier when the target is reached.
    With a batch schedule (budget in epochs) it is the sum of the phases' steps. A budget in tokens counts
    tokens_per_example per example (the targets' elements: a sequence's length for a language model).
    """
    if cfg.batch_schedule != "constant":
        start, _, steps = _phase_steps(cfg, n_train, tokens_per_example)[-1]
        return max(1, start + steps)
    if cfg.budget == "target":
        return cfg.max_steps
    if cfg.budget == "steps":
        return max(1, round(cfg.budget_amount))
    if cfg.budget == "examples":
        return max(1, math.ceil(cfg.budget_amount / cfg.batch_size))
    if cfg.budget == "tokens":
        return max(1, math.ceil(cfg.budget_amount / (cfg.batch_size * tokens_per_example)))
    return max(1, math.ceil(cfg.budget_amount * steps_per_epoch(cfg, n_train)))


def warmup_steps(cfg: RunConfig, n_train: int) -> int:
    """Steps of linear warmup (warmup_epochs converted with steps_per_epoch)."""
    return round(cfg.warmup_epochs * steps_per_epoch(cfg, n_train))


def lr_at(cfg: RunConfig, step: int, n_train: int, tokens_per_example: int = 1) -> float:
    """Learning rate for the update that follows `step` completed updates (step counts from 0).

    Linear warmup from peak/W to the peak over W steps, then the schedule over the remaining steps: constant;
    cosine to 0; step (x lr_decay_factor at each lr_decay_at fraction); wsd (the peak, then linear to 0 over the
    last lr_decay_fraction of the remaining steps: the update after the last step would have lr 0).
    """
    peak = scaled_lr(cfg) if cfg.batch_schedule != "tokens" else \
        scale_lr(cfg.lr, cfg.base_batch_size, batch_size_at(cfg, step, n_train, tokens_per_example), cfg.lr_scaling)
    warm = warmup_steps(cfg, n_train)
    if step < warm:
        return peak * (step + 1) / warm
    total = total_steps(cfg, n_train, tokens_per_example)
    progress = (step - warm) / max(1, total - warm)
    if cfg.schedule == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    if cfg.schedule == "step":
        return peak * cfg.lr_decay_factor ** sum(progress >= m for m in cfg.lr_decay_at)
    if cfg.schedule == "wsd":   # warmup-stable-decay: the peak, then linear to 0 over the last lr_decay_fraction
        return peak * min(1.0, max(0.0, (1.0 - progress) / cfg.lr_decay_fraction))
    return peak


def eval_steps(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> list[int]:
    """Steps (completed updates) after which the model is evaluated; always includes 0 and the last step."""
    last = total_steps(cfg, n_train, tokens_per_example)
    if cfg.eval_schedule == "every":
        steps = set(range(0, last + 1, cfg.eval_every))
    else:
        n_decades = math.log10(max(last, 1))
        points = round(n_decades * cfg.eval_per_decade)
        steps = {round(10 ** (i / cfg.eval_per_decade)) for i in range(points + 1)}
    steps |= set(snapshot_steps(cfg, n_train, tokens_per_example))
    if cfg.batch_schedule == "tokens":   # where the batch changes (a branch point)
        steps |= {start for start, _ in batch_phases(cfg, n_train, tokens_per_example)}
    return sorted({0, last} | {s for s in steps if s <= last})


def trajectory_end(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> int:
    """The last step a run shares with its trajectory: where its batch first changes, or its last step."""
    if cfg.batch_schedule == "tokens":
        return _phase_steps(cfg, n_train, tokens_per_example)[0][2]
    return total_steps(cfg, n_train, tokens_per_example)


def trajectory_of(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> str | None:
    """config.trajectory_key where the run's every update up to its trajectory end has the lr of the trajectory
    it names: a wsd run's only while its decay begins after that end (its last shared update at the peak)."""
    key = trajectory_key(cfg)
    if key is None or cfg.schedule != "wsd":
        return key
    last = trajectory_end(cfg, n_train, tokens_per_example) - 1
    stable = dataclasses.replace(cfg, schedule="constant")
    return key if last < 0 or lr_at(cfg, last, n_train, tokens_per_example) == lr_at(stable, last, n_train,
                                                                                     tokens_per_example) else None


def snapshot_steps(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> list[int]:
    """The steps at which the trajectory's state is saved (snapshot_at_tokens at the first batch size)."""
    return [max(1, math.ceil(round(t / (cfg.batch_size * tokens_per_example), 9))) for t in cfg.snapshot_at_tokens]


def derived(cfg: RunConfig, n_train: int, tokens_per_example: int = 1) -> dict[str, Any]:
    """The derived values written next to the config in config.json (sources: the file and sha256 behind
    each reference)."""
    trajectory = trajectory_of(cfg, n_train, tokens_per_example)
    return {
        "n_train": n_train,
        "tokens_per_example": tokens_per_example,
        "batch_tokens": cfg.batch_size * tokens_per_example,
        "effective_lr": scaled_lr(cfg),
        "steps_per_epoch": steps_per_epoch(cfg, n_train),
        "total_steps": total_steps(cfg, n_train, tokens_per_example),
        "warmup_steps": warmup_steps(cfg, n_train),
        "accumulation_steps": accumulation_steps(cfg),
        "bn_statistics_batch": bn_statistics_batch(cfg),
        **({"bn_batches": bn_batches(cfg)} if cfg.ghost_batch_size else {}),
        **device_values(cfg),
        "batch_phases": [list(p) for p in batch_phases(cfg, n_train, tokens_per_example)],
        **({"adam_beta2": [adam_beta2_at(cfg, b) for b in batch_sizes_of(cfg)]} if cfg.optimizer != "sgd" else {}),
        **({"trajectory": trajectory, "trajectory_end": trajectory_end(cfg, n_train, tokens_per_example),
            "snapshot_steps": snapshot_steps(cfg, n_train, tokens_per_example)} if trajectory else {}),
        "run_id": run_id(cfg),
        **({"sources": reference_sources(cfg)} if any(is_reference(getattr(cfg, f)) for f in REFERENCE_FIELDS)
           else {}),
    }


def check_data_size(cfg: RunConfig, n_train: int) -> None:
    """Every batch of the run, and the train-loss evaluation set, fit in n_train examples (ConfigError)."""
    check_batch_fits(cfg, n_train)
    for name in ("eval_train_size", "measure_train_size"):
        if getattr(cfg, name) and getattr(cfg, name) > n_train:
            raise ConfigError(f"{name} {getattr(cfg, name)} exceeds the training set size {n_train}")


def check_batch_fits(cfg: RunConfig, n_train: int) -> None:
    if cfg.batch_size > n_train:
        raise ConfigError(f"batch_size {cfg.batch_size} exceeds the training set size {n_train} "
                          f"(dataset {cfg.dataset!r}, train_size {cfg.train_size})")
    if cfg.batch_schedule == "step":
        largest = phase_batch_size(cfg, len(cfg.lr_decay_at))
        if largest > n_train:
            raise ConfigError(f"batch_schedule: the batch grows to {largest} (batch_size {cfg.batch_size} x "
                              f"batch_growth {cfg.batch_growth:g}^{len(cfg.lr_decay_at)}), more than the training "
                              f"set size {n_train}")
    if cfg.batch_schedule == "tokens" and max(cfg.batch_sizes) > n_train:
        raise ConfigError(f"batch_sizes: {max(cfg.batch_sizes)} exceeds the training set size {n_train}")
