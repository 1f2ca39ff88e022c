"""advise(): which batch size for your model on your hardware, how large fits, which learning rate goes
with it, and where more examples per step stop buying progress.

For any nn.Module (built by `model_fn`), data of (input, target) pairs and a mean-reduced loss; or for the
model, dataset, loss and optimizer a RunConfig names (`advise_config`: built-in names or FILE.py:NAME
references, exactly as `bsresearch train` takes them). It measures, on fresh models only (the user's
objects are never trained or modified):
- the largest batch that fits (systems.search: doubling then bisection, only torch.OutOfMemoryError
  counts; on CUDA the real allocator, capped at memory_budget; on the CPU the fitted linear memory model
  decides against memory_budget), and the peak memory of a step at every batch size (systems.memory:
  the allocator's peak on CUDA, tensor accounting on the CPU);
- synchronised throughput at every batch size (systems.timing) of the training step a run executes
  (systems.workload.train_on_batch); a batch beyond the safe size runs as the accumulation plan
  (systems.plan) of micro-batches, which is also how it would be trained;
- the gradient noise scale B_simple at the given weights: exact from per-example gradients with a
  bootstrap interval (noise.exact, torch.func.vmap), or where vmap cannot run the model the two-batch
  estimator with an interval from resampling its draws (noise.pairs.two_batch_summary); optionally its
  EMA along a short training run, trained by the one training loop (loop.py) with the noise-scale callback;
and recommends the batch that maximises examples/s x statistical efficiency 1 / (1 + B / B_simple)
(systems.recommend), with its accumulation plan and the learning rate the linear or sqrt rule gives
there (schedule.scale_lr), flagged when the batch is beyond the critical batch (B > B_simple).

What advise measures and how is an AdviseConfig (batch sizes, memory budget, the lr rule, how many examples
and draws, timing repeats, seed, device, devices); advise() takes one, or its fields as keyword arguments.

On several devices (`devices` N, RunConfig.devices: a run of N data-parallel processes) the batch sizes are
global batches, each split into N equal shares, and everything is still measured on one device: every device
holds the same share, so the search for the largest batch that fits is a search on one device (the largest
per-device batch; an out-of-memory error on one device is one of the run), the largest global batch without
accumulation is N times it (systems.plan.largest_batch_on_devices), and each batch's plan splits its
micro-batches over the devices with each device's share within the per-device limit
(systems.plan.accumulation_plan(..., devices=N)). Memory is that of one device's share, and the time is one
device running its share of each update: examples_per_second is one device's. The N devices together are not
timed (the gradient all-reduce between them is not measured) and no N-device throughput is derived; the
ranking by time to the target compares batch sizes by one device's time per update.

The batches for memory and time are the first B examples of the data (repeated cyclically when B is
larger than the data): a step's time and memory do not depend on the values.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ..config import LR_SCALINGS, OPTIMIZERS, ConfigError, RunConfig, did_you_mean
from ..data import Dataset, dataset_for
from ..driver import Place, callbacks_for
from ..engine import ModelEngine
from ..loading import check_model
from ..loop import Callback, Loop
from ..losses import Loss, LossFn, loss_for
from ..models import model_for
from ..noise.exact import gradient_noise_scale
from ..noise.microbatch import MicroBatchNoise
from ..noise.pairs import two_batch_pairs, two_batch_summary
from ..runsetup import RunSetup, dry_run
from ..runtime import make_generator, resolve_device
from ..schedule import adam_beta2_at, scale_lr
from ..sizes import format_bytes, parse_bytes
from ..state import new_state
from ..step import optimizer_for
from ..systems.fit import MemoryFit, fit_memory
from ..systems.memory import memory_cap, step_memory
from ..systems.plan import accumulation_plan, largest_batch_on_devices, largest_divisor_at_most
from ..systems.recommend import time_to_target
from ..systems.search import BatchSearch, largest_batch_size
from ..systems.timing import steps_for, summarise, time_steps, torch_threads
from ..systems.workload import TrainParts, free_memory, train_on_batch
from ..userdata import first_examples

OptimizerFn = Callable[[Any], torch.optim.Optimizer]  # parameters -> optimizer
DEFAULT_BATCH_SIZES = (8, 16, 32, 64, 128, 256, 512)
__all__ = ["Advice", "AdviseConfig", "advise", "advise_config", "optimizer_factory", "scale_lr"]


def optimizer_factory(name: str = "sgd", lr: float = 0.01, momentum: float = 0.9,
                      weight_decay: float = 0.0) -> OptimizerFn:
    """parameters -> torch.optim.{SGD (with momentum), Adam, AdamW} at lr (step.optimizer_for)."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
    if not (isinstance(lr, (int, float)) and 0 < lr < math.inf):
        raise ConfigError(f"lr must be a positive number; got {lr!r}")
    return lambda params: optimizer_for(name, params, lr, momentum, weight_decay=weight_decay)


@dataclass(frozen=True)
class AdviseConfig:
    """What advise measures and how. Checked on construction: a bad value is one ConfigError naming it."""
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES  # batch sizes to time and rank
    memory_budget: int | str | None = None  # bytes or '4GiB': CUDA caps the allocator; CPU: the memory model
    base_lr: float | None = None          # the lr tuned at base_batch_size (None: the optimizer's lr)
    base_batch_size: int | None = None    # where base_lr was tuned (None: the smallest batch size)
    lr_rule: str | None = None            # linear | sqrt | none (None: linear for SGD, sqrt for Adam-type)
    max_examples: int = 2048              # examples read from the data
    noise_examples: int = 512             # examples the noise scale is measured on
    n_bootstrap: int = 200                # resamples for its interval
    n_draws: int = 40                     # two-batch draws when per-example gradients cannot run
    train_steps: int = 0                  # > 0: also the noise scale's EMA along this many training steps
    max_batch_size: int | None = None     # the search's limit (None: the largest of batch_sizes)
    safety_margin: float = 0.1            # the safe batch is the largest that fits x (1 - this)
    warmup: int = 2                       # untimed steps before timing
    repeats: int = 3                      # timings per batch size (the median is reported)
    min_seconds: float = 0.05             # each timing lasts at least this long
    threads: int | None = 1               # torch CPU threads while timing (None: as they are)
    seed: int = 0                         # initial weights of fresh models and every random draw
    device: str | torch.device = "auto"
    devices: int | None = None            # devices a run trains on; batch sizes are global (None: the config's, or 1)

    def __post_init__(self) -> None:
        sizes = self.batch_sizes
        if isinstance(sizes, str) or not sizes or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in sizes):
            raise ConfigError(f"batch_sizes must be a non-empty list of positive integers; got {sizes!r}")
        object.__setattr__(self, "batch_sizes", tuple(sorted({int(v) for v in sizes})))
        budget = parse_bytes(self.memory_budget) if isinstance(self.memory_budget, str) else self.memory_budget
        if budget is not None and budget < 1:
            raise ConfigError(f"memory_budget must be a positive number of bytes; got {self.memory_budget!r}")
        object.__setattr__(self, "memory_budget", budget)
        if self.lr_rule is not None and self.lr_rule not in LR_SCALINGS:
            raise ConfigError(f"lr_rule must be one of {', '.join(LR_SCALINGS)}; got {self.lr_rule!r}")
        if not 0 <= self.safety_margin < 1:
            raise ConfigError(f"safety_margin must be in [0, 1); got {self.safety_margin}")
        for name, least in (("noise_examples", 2), ("n_draws", 2), ("repeats", 1), ("max_examples", 2),
                            ("train_steps", 0), ("warmup", 0), ("n_bootstrap", 0)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{name} must be an integer of at least {least}; got {value!r}")
        if self.devices is not None:
            if not isinstance(self.devices, (int, np.integer)) or isinstance(self.devices, bool) or self.devices < 1:
                raise ConfigError(f"devices must be a positive integer (1, 2, ...); got {self.devices!r}")
            object.__setattr__(self, "devices", int(self.devices))
            unequal = [b for b in self.batch_sizes if b % self.devices]
            if unequal:
                raise ConfigError(f"batch_sizes must split into {self.devices} equal per-device shares (multiples of "
                                  f"devices {self.devices}); got {unequal[0]}")
        if self.limit < self.batch_sizes[0]:
            raise ConfigError(f"max_batch_size {self.limit} is below the smallest batch size {self.batch_sizes[0]}")
        if self.base_lr is not None and not (isinstance(self.base_lr, (int, float)) and 0 < self.base_lr < math.inf):
            raise ConfigError(f"base_lr must be a positive number; got {self.base_lr!r}")

    @property
    def limit(self) -> int:
        """The largest batch the search may try."""
        return int(self.max_batch_size or self.batch_sizes[-1])

    def replace(self, **changes: Any) -> AdviseConfig:
        """The same settings with `changes`; an unknown name is a ConfigError naming the accepted ones."""
        names = [f.name for f in dataclasses.fields(self)]
        unknown = [k for k in changes if k not in names]
        if unknown:
            raise ConfigError(f"advise: unknown setting {unknown[0]!r}{did_you_mean(unknown[0], names)}; "
                              f"accepted: {', '.join(names)}")
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, eq=False)
class Advice:
    """The recommendation and every number it came from. Batch sizes in examples, memory in bytes."""
    batch_size: int                       # recommended: the largest examples/s x statistical efficiency
    micro_batch_size: int                 # examples per forward/backward pass at batch_size
    accumulation_steps: int               # batch_size // micro_batch_size (1: it fits as one pass)
    lr: float                             # learning rate at batch_size, from base_lr by lr_rule
    base_lr: float
    base_batch_size: int
    lr_rule: str                          # linear | sqrt | none
    beyond_critical: bool                 # batch_size > b_simple: extra examples per step buy little
    b_simple: float                       # gradient noise scale tr(Sigma)/|G|^2 at the given weights (examples)
    b_simple_interval: tuple[float, float] | None
    noise_method: str                     # exact_per_example | two_batch
    noise_fallback: str | None            # why the exact method could not run (the error, by name)
    noise_examples: int                   # examples the noise scale was measured on
    largest_batch_size: int               # largest batch that ran in one pass on one device (per device)
    safe_batch_size: int                  # largest x (1 - safety margin): the per-device micro-batch limit used
    search: BatchSearch
    memory_budget: int | None
    memory_fit: MemoryFit | None          # peak = fixed + per_example x B (CPU: decides the search)
    device: str
    table: pd.DataFrame                   # one row per batch size, see advise()
    noise_history: pd.DataFrame | None    # the noise scale's EMA along a short training run (train_steps)
    notes: tuple[str, ...] = field(default=())
    measured_at: str = "the given weights"  # where B_simple was measured: the given weights or the initial ones
    assumptions: tuple[str, ...] = field(default=())  # what advise assumed because it was not given (summary)
    devices: int = 1                      # devices sharing each batch; the search, memory and time are one device's

    @property
    def per_device_batch(self) -> int:
        """Examples each device runs at once at the recommended batch: micro_batch_size / devices."""
        return self.micro_batch_size // self.devices

    @property
    def largest_global_batch_size(self) -> int:
        """The largest global batch without accumulation: the largest per-device batch x devices."""
        return largest_batch_on_devices(self.largest_batch_size, self.devices)

    def summary(self) -> str:
        """A few lines for a terminal."""
        plan = ("in one pass" if self.accumulation_steps == 1 else
                f"as {self.accumulation_steps} micro-batches of {self.micro_batch_size} (gradient accumulation)")
        if self.devices > 1:
            plan = (f"on {self.devices} devices, {plan}: {self.per_device_batch} examples per device at once")
        interval = (f" [{self.b_simple_interval[0]:.3g}, {self.b_simple_interval[1]:.3g}]"
                    if self.b_simple_interval else "")
        row = self.table[self.table["batch_size"] == self.batch_size].iloc[0]
        lines = [f"recommended batch size {self.batch_size}, {plan}; lr {self.lr:.4g} "
                 f"({self.lr_rule} rule from lr {self.base_lr:.4g} at batch {self.base_batch_size})"]
        lines += [f"  assumed (not given): {a}" for a in self.assumptions]
        lines += [f"  {row['examples_per_second']:.4g} examples/s x statistical efficiency "
                 f"{row['statistical_efficiency']:.3f} on {self.device}"
                 + (f" (one device running its share of each update; {self.devices} devices not timed)"
                    if self.devices > 1 else ""),
                 f"  gradient noise scale B_simple {self.b_simple:.4g}{interval} examples at {self.measured_at} "
                 f"({self.noise_method}, {self.noise_examples} examples)",
                 f"  largest batch that fits: {self.largest_batch_size}"
                 + (" per device" if self.devices > 1 else "")
                 + (" (the search limit: no out-of-memory below it)" if self.search.reached_limit else "")
                 + (f" within {format_bytes(self.memory_budget)}" if self.memory_budget else "")
                 + (f"; {self.largest_global_batch_size} on {self.devices} devices without accumulation"
                    if self.devices > 1 else "")]
        if self.beyond_critical:
            lines.append(f"  note: batch {self.batch_size} is beyond the critical batch (B_simple "
                         f"{self.b_simple:.3g} at {self.measured_at}): it is recommended because it still makes the "
                         f"most progress per second here (examples/s x efficiency), but each extra example per "
                         f"step buys little and the {self.lr_rule} lr rule from batch {self.base_batch_size} is "
                         f"unreliable there")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-ready values (tables as lists of row dicts, NaN as None)."""
        def clean(value: Any) -> Any:
            if isinstance(value, float) and not math.isfinite(value):
                return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
            if isinstance(value, (np.floating, np.integer, np.bool_)):
                return clean(value.item())
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [clean(v) for v in value]
            return value

        def rows(df: pd.DataFrame | None) -> list[dict[str, Any]] | None:
            return None if df is None else [clean(r) for r in df.to_dict(orient="records")]
        fit = self.memory_fit
        return clean({
            "recommendation": {"batch_size": self.batch_size, "micro_batch_size": self.micro_batch_size,
                               "accumulation_steps": self.accumulation_steps, "devices": self.devices,
                               "per_device_batch": self.per_device_batch, "lr": self.lr,
                               "base_lr": self.base_lr, "base_batch_size": self.base_batch_size,
                               "lr_rule": self.lr_rule, "beyond_critical": self.beyond_critical},
            "noise_scale": {"b_simple": self.b_simple, "interval": self.b_simple_interval,
                            "method": self.noise_method, "fallback_reason": self.noise_fallback,
                            "n_examples": self.noise_examples},
            "memory": {"devices": self.devices, "largest_batch_size": self.largest_batch_size,
                       "largest_global_batch_size": self.largest_global_batch_size,
                       "safe_batch_size": self.safe_batch_size,
                       "first_failure": self.search.first_failure, "search_reached_limit": self.search.reached_limit,
                       "search_limit": self.search.limit, "sizes_tried": self.search.sizes_tried,
                       "fits": [ok for _, ok in self.search.tried], "memory_budget": self.memory_budget,
                       "fit": None if fit is None else {"fixed_bytes": fit.fixed_bytes,
                                                        "per_example_bytes": fit.per_example_bytes,
                                                        "max_residual_bytes": fit.max_residual_bytes}},
            "device": self.device, "notes": list(self.notes), "measured_at": self.measured_at,
            "assumptions": list(self.assumptions),
            "table": rows(self.table), "noise_history": rows(self.noise_history)})


# ----------------------------------------------------------------------------- fresh models
class _Models:
    """Builds fresh training parts: model_fn() (or a deep copy of a model instance), the given weights
    loaded, on the device, with a fresh optimizer. model_fn runs under torch.random.fork_rng with a fixed
    seed: every fresh model has the same initial weights and the caller's global RNG state is untouched."""

    def __init__(self, model_fn: Callable[[], nn.Module] | nn.Module, weights: nn.Module | dict | None,
                 optimizer_fn: OptimizerFn, device: torch.device, seed: int) -> None:
        self.model_fn, self.optimizer_fn, self.device, self.seed = model_fn, optimizer_fn, device, seed
        if isinstance(weights, nn.Module):
            weights = weights.state_dict()
        # a CPU copy now: the caller's tensors are only ever read here, once
        self.weights = None if weights is None else {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}

    def model(self) -> nn.Module:
        if isinstance(self.model_fn, nn.Module):
            model = copy.deepcopy(self.model_fn)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                model = self.model_fn()
            check_model(model)
        if self.weights is not None:
            try:
                model.load_state_dict(self.weights)
            except RuntimeError as exc:
                raise ConfigError(f"weights do not fit the model: {str(exc).splitlines()[0]}") from None
        return model.to(self.device).train()

    def parts(self) -> TrainParts:
        model = self.model()
        return TrainParts(model, self.optimizer_fn(model.parameters()), None, "fp32")


def _batch_of(x: torch.Tensor, y: torch.Tensor) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """batch_size -> the first batch_size examples (repeated cyclically beyond len(x))."""
    def batch(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.arange(batch_size, device=x.device) % len(x)
        return x[idx], y[idx]
    return batch


@contextmanager
def _quiet_oom(row: dict[str, Any], device: torch.device) -> Iterator[None]:
    """Record an out-of-memory error in row['status'] instead of raising it; free what the trial left."""
    try:
        yield
        row.setdefault("status", "ok")
    except torch.OutOfMemoryError as exc:
        row["status"] = "oom"
        row["error"] = f"OutOfMemoryError: {str(exc).splitlines()[0] if str(exc) else ''}"
    free_memory(device, after_failure=row["status"] != "ok")


def _memory_and_time(models: _Models, batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]], batch_size: int,
                     micro_batch_size: int, loss_fn: LossFn, device: torch.device,
                     settings: AdviseConfig) -> dict[str, Any]:
    """Peak memory of a step at the micro-batch (StepMemory fields) and the time of a whole update of
    batch_size examples in micro-batches (timing.summarise fields, examples_per_second), on fresh parts."""
    parts = models.parts()
    mem = step_memory(parts, *batch(micro_batch_size), loss_fn)
    x, y = batch(batch_size)

    def step() -> object:
        return train_on_batch(parts, x, y, loss_fn, micro_batch_size)
    step()  # allocation and lazy initialisation: never timed
    stats = summarise(time_steps(step, device, steps=steps_for(step, device, settings.min_seconds),
                                 repeats=settings.repeats, warmup=settings.warmup))
    return {**{k: v for k, v in mem.__dict__.items() if k != "batch_size"}, **stats,
            "examples_per_second": batch_size / stats["seconds_per_step"]}


# ----------------------------------------------------------------------------- the noise scale
def _noise_at_weights(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, b_big: int,
                      generator: torch.Generator, settings: AdviseConfig,
                      confidence: float = 0.95) -> tuple[float, tuple[float, float] | None, str, str | None]:
    """(b_simple, interval, method, why the exact method failed). Exact per-example gradients (vmap) on
    all of (x, y), else the two-batch estimator on n_draws pairs drawn with replacement, its interval from
    resampling the pairs (noise.pairs.two_batch_summary: the ratio taken after averaging)."""
    try:
        exact = gradient_noise_scale(model, x, y, chunk_size=64, n_bootstrap=settings.n_bootstrap,
                                     confidence=confidence, generator=generator, loss_fn=loss_fn)
        return exact.b_simple, exact.b_simple_interval, "exact_per_example", None
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:  # vmap on a model it cannot batch
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    b_big = max(2, min(b_big, len(x)))
    b_small = max(1, b_big // 4)
    pairs = two_batch_pairs(model, x, y, b_small, b_big, settings.n_draws, generator, loss_fn)
    summary = two_batch_summary(pairs, n_bootstrap=max(settings.n_bootstrap, 1), confidence=confidence,
                                seed=settings.seed)
    interval = (summary["low"], summary["high"]) if settings.n_bootstrap else None
    return summary["b_simple"], interval, "two_batch", reason


class _EMAHistory(Callback):
    """advise's record of a short training run: the batch loss and B_simple's EMA after every step."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        member = loop.members[0]
        state, ema = member.state, loop.callback(MicroBatchNoise).of(member)
        self.rows.append({"step": state.step, "examples_seen": state.examples_seen, "loss": float(losses[0]),
                          "b_simple_ema": ema.b_simple if ema else math.nan})


def _noise_along_training(models: _Models, x: torch.Tensor, y: torch.Tensor, loss: Loss, batch_size: int,
                          lr: float, settings: AdviseConfig, device: torch.device) -> pd.DataFrame | None:
    """Train a fresh model train_steps steps at batch_size (batches drawn with replacement) with the
    user's optimizer at lr, through the one training loop; the noise scale's EMA (noise.MicroBatchNoise,
    decay 0.9) after every step, from the step's two halves. None for a batch of one example."""
    micro = largest_divisor_at_most(batch_size, batch_size // 2)
    if micro < 1:
        return None
    cfg = RunConfig(batch_size=batch_size, base_batch_size=batch_size, micro_batch_size=micro, lr=lr,
                    budget="steps", budget_amount=settings.train_steps, sampling="replacement",
                    noise_scale_every=1, noise_scale_ema=0.9, seed=settings.seed, device=str(device))
    data = Dataset("advise", x, y, x[:0], y[:0], None)
    parts = models.parts()
    setup = RunSetup.checked(parts.model, data, loss)
    member = setup.member(0, cfg, state=new_state(cfg, data, device, model=parts.model, optimizer=parts.optimizer))
    history = _EMAHistory()
    callbacks = callbacks_for(Place.probe(), [cfg], callbacks=[history])   # the noise scale and the history
    setup.loop([member], ModelEngine(data, loss, setup.task), callbacks).run()
    if member.outcome != "ok":
        raise RuntimeError(f"the short training run failed: {member.error}")
    return pd.DataFrame(history.rows)


# ----------------------------------------------------------------------------- advise
def advise(model_fn: Callable[[], nn.Module] | nn.Module, data: Any, loss_fn: str | LossFn = "cross_entropy",
           optimizer_fn: OptimizerFn | None = None, weights: nn.Module | dict[str, torch.Tensor] | None = None,
           settings: AdviseConfig | None = None, **changes: Any) -> Advice:
    """Measure and recommend a batch size for model_fn on data with loss_fn; see the module docstring.

    model_fn: called with no arguments for each fresh model (its random init runs under a fixed seed,
      the caller's global RNG untouched); or an nn.Module instance, deep-copied (never trained itself).
    data: a Dataset of (input, target) pairs, a DataLoader, or a pair of tensors; the first max_examples
      are read once (userdata.first_examples). loss_fn(model(x), y) is a mean-reduced scalar loss: a name
      in losses.LOSSES ('cross_entropy' also handles (batch, seq, vocab) logits), a reference, or a callable.
    optimizer_fn: parameters -> optimizer (default SGD lr 0.01 momentum 0.9); base_lr defaults to its lr.
    weights: a state_dict or a model whose weights every fresh model gets (read, never modified); the
      noise scale is measured there (default: model_fn's initial weights).
    settings: an AdviseConfig; `changes` are its fields (advise(..., batch_sizes=[8, 16], device="cpu")).

    The table has one row per batch size: batch_size, micro_batch_size, accumulation_steps, status ('ok'
    or 'oom'), examples_per_second, seconds_per_step (median over repeats; q1/q3/min/max), peak_bytes and
    its parts (systems.memory.StepMemory, at the micro-batch), statistical_efficiency,
    effective_examples_per_second, steps_to_target, predicted_seconds (systems.recommend), lr, beyond_critical,
    devices and per_device_batch (micro_batch_size / devices: what one device runs at once). On several devices
    peak_bytes is one device's at per_device_batch and the times are one device's running its share of an update
    (batch_size / devices examples): see the module docstring.
    """
    # --- every argument checked before any work
    settings = (settings or AdviseConfig()).replace(**changes)
    sizes, budget, limit = list(settings.batch_sizes), settings.memory_budget, settings.limit
    devices = settings.devices or 1
    assert budget is None or isinstance(budget, int)
    dev = resolve_device(settings.device) if isinstance(settings.device, str) else torch.device(settings.device)
    loss = loss_for(loss_fn)
    optimizer_fn_given, optimizer_fn = optimizer_fn, optimizer_fn or optimizer_factory("sgd", 0.01)
    x_cpu, y_cpu = first_examples(data, settings.max_examples)
    models = _Models(model_fn, weights, optimizer_fn, dev, settings.seed)
    x: Any = x_cpu.to(dev)   # a tensor, or named tensors (batch.Features): indexed alike
    y = y_cpu.to(dev)
    batch = _batch_of(x, y)
    probe = models.parts()
    check = Dataset("advise", x, y, x[:0], y[:0], None)
    dry_run(probe.model, check, loss, model_name=_name(model_fn))
    base_lr = float(settings.base_lr if settings.base_lr is not None else probe.optimizer.param_groups[0]["lr"])
    base_batch_size = int(settings.base_batch_size or sizes[0])
    rule = settings.lr_rule or ("linear" if isinstance(probe.optimizer, torch.optim.SGD) else "sqrt")
    assumptions = []   # what the user did not give, said in the summary so that the numbers read as they are
    if settings.base_lr is None and optimizer_fn_given is None:
        assumptions.append(f"lr {base_lr:g} (advise's default optimizer, SGD with momentum 0.9; pass your "
                           f"optimizer_fn or base_lr)")
    if settings.base_batch_size is None:
        assumptions.append(f"that lr was tuned at batch {base_batch_size}, the smallest batch size measured "
                           f"(base_batch_size)")
    measured_at = "the given weights" if weights is not None else "the initial weights"
    if weights is None:
        assumptions.append(_INITIAL_WEIGHTS)
    generator = torch.Generator().manual_seed(settings.seed)
    notes: list[str] = []

    # Every random draw of the user's model (dropout) comes from a forked, seeded global RNG: the results
    # repeat, and the caller's RNG state is as it was.
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(settings.seed)
        # --- the largest batch that fits (CPU with a budget: the memory model, fitted from accounted peaks at
        # the smallest sizes, decides; on several devices a search on one device, over per-device batches)
        shares, device_limit = [b // devices for b in sizes], limit // devices
        fit = None
        if dev.type != "cuda" and budget is not None:
            fit_sizes = [b for b in shares if b <= device_limit][:4]
            if len(fit_sizes) < 2:
                fit_sizes = [shares[0], 2 * shares[0]]
            fit = fit_memory(fit_sizes, [step_memory(probe, *batch(b), loss).peak_bytes for b in fit_sizes])
        search = largest_batch_size(probe, None, memory_budget=budget, start=shares[0], limit=device_limit,
                                    safety_margin=settings.safety_margin, fit=fit, batch_fn=batch, loss_fn=loss)
        del probe
        safe = search.safe_batch_size if search.largest_batch_size < device_limit else device_limit
        if search.largest_batch_size == 0:
            raise ConfigError(f"not even a batch of {search.sizes_tried[-1]} fits in memory"
                              + (f" (budget {budget} bytes)" if budget else "") + "; raise the memory budget")

        # --- memory and throughput at each batch size (a batch beyond the safe size: its accumulation plan; on
        # several devices one device's share of it, in per-device micro-batches)
        rows = []
        threads = settings.threads if dev.type == "cpu" else None
        with memory_cap(budget, dev), torch_threads(threads):
            for b in sizes:
                plan = accumulation_plan(b, safe, devices)
                row: dict[str, Any] = {"batch_size": b, "micro_batch_size": plan.micro_batch_size,
                                       "accumulation_steps": plan.accumulation_steps, "devices": devices,
                                       "per_device_batch": plan.per_device_batch}
                with _quiet_oom(row, dev):
                    row.update(_memory_and_time(models, batch, b // devices, plan.per_device_batch, loss, dev,
                                                settings))
                rows.append(row)
        table = pd.DataFrame(rows)
        one_pass = table[(table["status"] == "ok") & (table["accumulation_steps"] == 1)]
        if fit is None and len(one_pass) >= 2:  # for the record (with a CPU budget, the fit that decided stays)
            fit = fit_memory(one_pass["per_device_batch"].tolist(), one_pass["peak_bytes"].tolist())  # one device's

        # --- the noise scale at the given weights, and optionally along training
        model = models.model()
        n_noise = settings.noise_examples
        b_simple, interval, method, fallback = _noise_at_weights(
            model, x[:n_noise], y[:n_noise], loss, b_big=min(safe, 128), generator=generator, settings=settings)
        del model
        history = None
        if settings.train_steps > 0:
            history = _noise_along_training(models, x, y, loss, base_batch_size, base_lr, settings, dev)
            if history is None:
                notes.append(f"no noise scale along training: a batch of {base_batch_size} has no two halves")
        if fallback:
            notes.append(f"exact per-example gradients could not run ({fallback}); used the two-batch estimator")
        if devices > 1:
            notes.append(f"on {devices} devices: memory and time are one device's running its share of each batch "
                         f"(batch_size / {devices}); the {devices} devices together, and the communication between "
                         f"them, were not timed")

        # --- the recommendation
        if not 0 < b_simple < math.inf:
            notes.append(f"B_simple is {b_simple:.3g} at these weights (the measured mean gradient is mostly noise): "
                         f"recommended by throughput alone; measure at trained weights or on more examples")
            efficiency_scale = math.inf
        else:
            efficiency_scale = b_simple
        ranked = time_to_target(table, b_simple=efficiency_scale if math.isfinite(efficiency_scale) else 1e300)
        if ranked.empty:
            raise ConfigError("no batch size ran (every one was out of memory); lower batch_sizes or raise the budget")
        table = table.merge(ranked[["batch_size", "statistical_efficiency", "effective_examples_per_second",
                                    "steps_to_target", "predicted_seconds"]], on="batch_size", how="left")
        table["lr"] = [scale_lr(base_lr, base_batch_size, int(b), rule) for b in table["batch_size"]]
        table["beyond_critical"] = table["batch_size"] > b_simple
        best = table.loc[table["effective_examples_per_second"].idxmax()]
        batch_size = int(best["batch_size"])
    return Advice(batch_size=batch_size, micro_batch_size=int(best["micro_batch_size"]),
                  accumulation_steps=int(best["accumulation_steps"]), lr=float(best["lr"]), base_lr=base_lr,
                  base_batch_size=base_batch_size, lr_rule=rule, beyond_critical=bool(best["beyond_critical"]),
                  b_simple=float(b_simple), b_simple_interval=interval, noise_method=method,
                  noise_fallback=fallback, noise_examples=min(n_noise, len(x)),
                  largest_batch_size=search.largest_batch_size, safe_batch_size=safe, search=search,
                  memory_budget=budget, memory_fit=fit, device=str(dev), table=table, noise_history=history,
                  notes=tuple(notes), measured_at=measured_at, assumptions=tuple(assumptions), devices=devices)


_INITIAL_WEIGHTS = ("the noise scale measured at the model's initial weights; it usually grows as the loss falls, "
                    "so a batch beyond it now may not be later (--train-steps / train_steps follows it along a "
                    "short training run; weights= measures it at trained weights)")


def _name(model_fn: Any) -> str:
    return type(model_fn).__name__ if isinstance(model_fn, nn.Module) else getattr(model_fn, "__name__", "model_fn")


def advise_config(cfg: RunConfig, settings: AdviseConfig | None = None, **changes: Any) -> Advice:
    """advise() for the model, dataset, loss and optimizer that `cfg` names, built-in names or FILE.py:NAME
    references alike (models.model_for, data.dataset_for, losses.loss_for): fresh models of the config's
    seed, the first max_examples training examples, the config's optimizer at cfg.lr, which is the base lr
    at cfg.base_batch_size. The settings' lr_rule, else the config's lr_scaling when it is linear or sqrt, else
    advise's default by optimizer is the rule; the device is the config's unless the settings name one, and so
    are the devices (cfg.devices: the batch sizes are then global batches, see advise)."""
    settings = (settings or AdviseConfig()).replace(**changes)
    if "device" not in changes and (settings.device == "auto"):
        settings = settings.replace(device=cfg.device)
    if settings.devices is None:
        settings = settings.replace(devices=cfg.devices)
    data = dataset_for(cfg, "cpu")
    x, y = data.first(min(settings.max_examples, data.n_train))
    init = make_generator(cfg.seed, "init")
    state = init.get_state()

    def model_fn() -> nn.Module:
        init.set_state(state)  # every fresh model has the config's initial weights
        return model_for(cfg, data, init)

    def optimizer_fn(params: Any) -> torch.optim.Optimizer:
        return optimizer_for(cfg.optimizer, params, cfg.lr, cfg.momentum, cfg.nesterov, cfg.weight_decay,
                             adam_beta2_at(cfg, cfg.batch_size))
    model_fn.__name__ = cfg.model
    rule = settings.lr_rule or (None if cfg.lr_scaling == "none" else cfg.lr_scaling)
    advice = advise(model_fn, (x, y), loss_for(cfg.loss), optimizer_fn,
                    settings=settings.replace(base_lr=cfg.lr, base_batch_size=cfg.base_batch_size, lr_rule=rule))
    defaults = RunConfig()
    assumed = []   # a config's lr and base batch at RunConfig's defaults were most likely not chosen for this model
    if cfg.lr == defaults.lr:
        assumed.append(f"lr {cfg.lr:g}, RunConfig's default, not one tuned for this model (--lr)")
    if cfg.base_batch_size == defaults.base_batch_size:
        assumed.append(f"that lr holds at batch {cfg.base_batch_size}, RunConfig's default (--base-batch-size)")
    return dataclasses.replace(advice, assumptions=(*assumed, *advice.assumptions))
