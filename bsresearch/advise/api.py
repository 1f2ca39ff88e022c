"""advise(): which batch size for your model on your hardware, how large fits, which learning rate goes
with it, and where more examples per step stop buying progress.

For any nn.Module (built by `model_fn`), data of (input, target) pairs and a mean-reduced loss. It
measures, on fresh models only (the user's objects are never trained or modified):
- the largest batch that fits (systems.search: doubling then bisection, only torch.OutOfMemoryError
  counts; on CUDA the real allocator, capped at memory_budget; on the CPU the fitted linear memory model
  decides against memory_budget), and the peak memory of a step at every batch size (systems.memory:
  the allocator's peak on CUDA, tensor accounting on the CPU);
- synchronised throughput at every batch size (systems.timing); a batch beyond the safe size runs as
  the accumulation plan (systems.plan) of micro-batches, which is also how it would be trained;
- the gradient noise scale B_simple at the given weights: exact from per-example gradients with a
  bootstrap interval (measure.noise, torch.func.vmap), or where vmap cannot run the model the two-batch
  estimator with an interval from resampling its draws; optionally its EMA along a short training run;
and recommends the batch that maximises examples/s x statistical efficiency 1 / (1 + B / B_simple)
(systems.recommend), with its accumulation plan and the learning rate the linear or sqrt rule gives
there, flagged when the batch is beyond the critical batch (B > B_simple).

The batches for memory and time are the first B examples of the data (repeated cyclically when B is
larger than the data): a step's time and memory do not depend on the values.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn

from ..config import LR_SCALINGS, ConfigError
from ..measure.noise import gradient_noise_scale, two_batch_estimate, two_batch_noise_scale
from ..noise_tracker import NoiseScaleTracker
from ..runtime import resolve_device
from ..systems.fit import MemoryFit, fit_memory
from ..systems.memory import memory_cap, step_memory
from ..systems.plan import accumulation_plan
from ..systems.recommend import time_to_target
from ..systems.search import BatchSearch, largest_batch_size
from ..systems.timing import steps_for, summarise, time_steps, torch_threads
from ..systems.workload import TrainParts, free_memory, training_step
from .loading import LossFn, check_model, data_tensors, resolve_loss

OPTIMIZERS = ("sgd", "adam", "adamw")
OptimizerFn = Callable[[Any], torch.optim.Optimizer]  # parameters -> optimizer
DEFAULT_BATCH_SIZES = (8, 16, 32, 64, 128, 256, 512)


def optimizer_factory(name: str = "sgd", lr: float = 0.01, momentum: float = 0.9,
                      weight_decay: float = 0.0) -> OptimizerFn:
    """parameters -> torch.optim.{SGD (with momentum), Adam, AdamW} at lr."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}")
    if not (isinstance(lr, (int, float)) and 0 < lr < math.inf):
        raise ConfigError(f"lr must be a positive number; got {lr!r}")

    def make(params: Any) -> torch.optim.Optimizer:
        if name == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return cls(params, lr=lr, weight_decay=weight_decay)
    return make


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} bytes"


def scale_lr(base_lr: float, base_batch_size: int, batch_size: int, rule: str) -> float:
    """lr at batch_size from base_lr at base_batch_size: x ratio (linear), x sqrt(ratio) (sqrt), as is (none)."""
    ratio = batch_size / base_batch_size
    return base_lr * {"none": 1.0, "linear": ratio, "sqrt": ratio ** 0.5}[rule]


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
    largest_batch_size: int               # largest batch that ran in one pass (search limit: search.limit)
    safe_batch_size: int                  # largest x (1 - safety margin): the micro-batch limit used
    search: BatchSearch
    memory_budget: int | None
    memory_fit: MemoryFit | None          # peak = fixed + per_example x B (CPU: decides the search)
    device: str
    table: pd.DataFrame                   # one row per batch size, see advise()
    noise_history: pd.DataFrame | None    # the noise scale's EMA along a short training run (train_steps)
    notes: tuple[str, ...] = field(default=())

    def summary(self) -> str:
        """A few lines for a terminal."""
        plan = ("in one pass" if self.accumulation_steps == 1 else
                f"as {self.accumulation_steps} micro-batches of {self.micro_batch_size} (gradient accumulation)")
        interval = (f" [{self.b_simple_interval[0]:.3g}, {self.b_simple_interval[1]:.3g}]"
                    if self.b_simple_interval else "")
        row = self.table[self.table["batch_size"] == self.batch_size].iloc[0]
        lines = [f"recommended batch size {self.batch_size}, {plan}; lr {self.lr:.4g} "
                 f"({self.lr_rule} rule from lr {self.base_lr:.4g} at batch {self.base_batch_size})",
                 f"  {row['examples_per_second']:.4g} examples/s x statistical efficiency "
                 f"{row['statistical_efficiency']:.3f} on {self.device}",
                 f"  gradient noise scale B_simple {self.b_simple:.4g}{interval} examples ({self.noise_method}, "
                 f"{self.noise_examples} examples)",
                 f"  largest batch that fits: {self.largest_batch_size}"
                 + (" (the search limit: no out-of-memory below it)" if self.search.reached_limit else "")
                 + (f" within {format_bytes(self.memory_budget)}" if self.memory_budget else "")]
        if self.beyond_critical:
            lines.append(f"  note: batch {self.batch_size} is beyond the critical batch (B_simple "
                         f"{self.b_simple:.3g}): the {self.lr_rule} lr rule is unreliable there and each extra "
                         f"example per step buys little")
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
                               "accumulation_steps": self.accumulation_steps, "lr": self.lr,
                               "base_lr": self.base_lr, "base_batch_size": self.base_batch_size,
                               "lr_rule": self.lr_rule, "beyond_critical": self.beyond_critical},
            "noise_scale": {"b_simple": self.b_simple, "interval": self.b_simple_interval,
                            "method": self.noise_method, "fallback_reason": self.noise_fallback,
                            "n_examples": self.noise_examples},
            "memory": {"largest_batch_size": self.largest_batch_size, "safe_batch_size": self.safe_batch_size,
                       "first_failure": self.search.first_failure, "search_reached_limit": self.search.reached_limit,
                       "search_limit": self.search.limit, "sizes_tried": self.search.sizes_tried,
                       "fits": [ok for _, ok in self.search.tried], "memory_budget": self.memory_budget,
                       "fit": None if fit is None else {"fixed_bytes": fit.fixed_bytes,
                                                        "per_example_bytes": fit.per_example_bytes,
                                                        "max_residual_bytes": fit.max_residual_bytes}},
            "device": self.device, "notes": list(self.notes),
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


def accumulated_step(parts: TrainParts, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                     micro_batch_size: int) -> torch.Tensor:
    """One optimizer update on (x, y) in micro-batches: each micro-batch's mean loss weighted by its share,
    so the gradient is the whole batch's (as bsresearch.train does). One micro-batch: systems' training_step."""
    if micro_batch_size >= len(x):
        return training_step(parts, x, y, loss_fn)
    parts.optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=x.device)
    for xm, ym in zip(x.split(micro_batch_size), y.split(micro_batch_size)):
        loss = loss_fn(parts.model(xm), ym) * (len(xm) / len(x))
        loss.backward()
        total += loss.detach()
    parts.optimizer.step()
    return total


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
                     micro_batch_size: int, loss_fn: LossFn, device: torch.device, warmup: int, repeats: int,
                     min_seconds: float) -> dict[str, Any]:
    """Peak memory of a step at the micro-batch (StepMemory fields) and the time of a whole update of
    batch_size examples in micro-batches (timing.summarise fields, examples_per_second), on fresh parts."""
    parts = models.parts()
    mem = step_memory(parts, *batch(micro_batch_size), loss_fn)
    x, y = batch(batch_size)

    def step() -> object:
        return accumulated_step(parts, x, y, loss_fn, micro_batch_size)
    step()  # allocation and lazy initialisation: never timed
    stats = summarise(time_steps(step, device, steps=steps_for(step, device, min_seconds), repeats=repeats,
                                 warmup=warmup))
    return {**{k: v for k, v in mem.__dict__.items() if k != "batch_size"}, **stats,
            "examples_per_second": batch_size / stats["seconds_per_step"]}


# ----------------------------------------------------------------------------- the noise scale
def _noise_at_weights(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, b_big: int,
                      generator: torch.Generator, n_bootstrap: int, n_draws: int,
                      confidence: float = 0.95) -> tuple[float, tuple[float, float] | None, str, str | None]:
    """(b_simple, interval, method, why the exact method failed). Exact per-example gradients (vmap) on
    all of (x, y), else the two-batch estimator on n_draws draws with replacement, its interval from
    resampling the draws (the ratio taken after averaging, in each resample)."""
    try:
        exact = gradient_noise_scale(model, x, y, chunk_size=64, n_bootstrap=n_bootstrap, confidence=confidence,
                                     generator=generator, loss_fn=loss_fn)
        return exact.b_simple, exact.b_simple_interval, "exact_per_example", None
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:  # vmap on a model it cannot batch
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    b_big = max(2, min(b_big, len(x)))
    b_small = max(1, b_big // 4)
    draws = [two_batch_noise_scale(model, x, y, b_small, b_big, n_draws=1, generator=generator, loss_fn=loss_fn)
             for _ in range(n_draws)]
    small = np.array([d.sq_norm_small for d in draws])
    big = np.array([d.sq_norm_big for d in draws])

    def ratio(s: np.ndarray, b: np.ndarray) -> float:
        grad_sq, trace = two_batch_estimate(float(s.mean()), float(b.mean()), b_small, b_big)
        return trace / grad_sq if grad_sq > 0 else math.inf
    interval = None
    if n_bootstrap:
        idx = torch.randint(n_draws, (n_bootstrap, n_draws), generator=generator).numpy()
        reps = np.array([ratio(small[i], big[i]) for i in idx])
        low, high = np.quantile(reps, [(1 - confidence) / 2, (1 + confidence) / 2])
        interval = (float(low), float(high))
    return ratio(small, big), interval, "two_batch", reason


def _noise_along_training(models: _Models, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, batch_size: int,
                          steps: int, generator: torch.Generator) -> pd.DataFrame:
    """Train a fresh model `steps` steps at batch_size (batches drawn with replacement) with the user's
    optimizer; NoiseScaleTracker's EMA after every step."""
    parts = models.parts()
    model, optimizer = parts.model, parts.optimizer
    tracker = NoiseScaleTracker(model, decay=0.9)
    rows = []
    for step in range(steps):
        idx = torch.randint(len(x), (batch_size,), generator=generator).to(x.device)
        xb, yb = x[idx], y[idx]
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        b_simple = tracker.observe(lambda xs, ys: loss_fn(model(xs), ys), xb, yb)
        optimizer.step()
        rows.append({"step": step + 1, "examples_seen": (step + 1) * batch_size, "loss": float(loss.detach()),
                     "b_simple_ema": b_simple})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- advise
def _positive_ints(values: Sequence[int], name: str) -> list[int]:
    if isinstance(values, str) or not values or not all(isinstance(v, (int, np.integer)) and v >= 1 for v in values):
        raise ConfigError(f"{name} must be a non-empty list of positive integers; got {values!r}")
    return sorted(set(int(v) for v in values))


def advise(model_fn: Callable[[], nn.Module] | nn.Module, data: Any, loss_fn: str | LossFn = "cross_entropy",
           optimizer_fn: OptimizerFn | None = None, device: str | torch.device = "auto",
           memory_budget: int | str | None = None, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
           weights: nn.Module | dict[str, torch.Tensor] | None = None, base_lr: float | None = None,
           base_batch_size: int | None = None, lr_rule: str | None = None, max_examples: int = 2048,
           noise_examples: int = 512, n_bootstrap: int = 200, n_draws: int = 40, train_steps: int = 0,
           max_batch_size: int | None = None, safety_margin: float = 0.1, warmup: int = 2, repeats: int = 3,
           min_seconds: float = 0.05, threads: int | None = 1, seed: int = 0) -> Advice:
    """Measure and recommend a batch size for model_fn on data with loss_fn; see the module docstring.

    model_fn: called with no arguments for each fresh model (its random init runs under a fixed seed,
      the caller's global RNG untouched); or an nn.Module instance, deep-copied (never trained itself).
    data: a Dataset of (input, target) pairs, a DataLoader, or a pair of tensors; the first max_examples
      are read once (see loading.data_tensors). loss_fn(model(x), y) is a mean-reduced scalar loss: a name
      in loading.LOSSES ('cross_entropy' also handles (batch, seq, vocab) logits), or a callable.
    optimizer_fn: parameters -> optimizer (default SGD lr 0.01 momentum 0.9); base_lr defaults to its lr.
    weights: a state_dict or a model whose weights every fresh model gets (read, never modified); the
      noise scale is measured there (default: model_fn's initial weights).
    memory_budget: bytes or '4GiB'. CUDA: the allocator is capped at it; CPU: the fitted memory model
      decides what fits. None: the device's memory (CUDA) / no limit (CPU) up to max_batch_size
      (default the largest of batch_sizes), which bounds the search.
    lr_rule: linear | sqrt | none; default linear for SGD, sqrt otherwise (Adam-type).
    train_steps > 0 adds the noise scale's EMA along that many training steps at base_batch_size.

    The table has one row per batch size: batch_size, micro_batch_size, accumulation_steps, status ('ok'
    or 'oom'), examples_per_second, seconds_per_step (median over repeats; q1/q3/min/max), peak_bytes and
    its parts (systems.memory.StepMemory, at the micro-batch), statistical_efficiency,
    effective_examples_per_second, steps_to_target, predicted_seconds (systems.recommend), lr, beyond_critical.
    """
    # --- every argument checked before any work
    from ..systems.cli import parse_bytes
    sizes = _positive_ints(batch_sizes, "batch_sizes")
    budget = parse_bytes(memory_budget) if isinstance(memory_budget, str) else memory_budget
    if budget is not None and budget < 1:
        raise ConfigError(f"memory_budget must be a positive number of bytes; got {memory_budget!r}")
    if lr_rule is not None and lr_rule not in LR_SCALINGS:
        raise ConfigError(f"lr_rule must be one of {', '.join(LR_SCALINGS)}; got {lr_rule!r}")
    if not 0 <= safety_margin < 1:
        raise ConfigError(f"safety_margin must be in [0, 1); got {safety_margin}")
    for name, count, least in (("noise_examples", noise_examples, 2), ("n_draws", n_draws, 2),
                               ("repeats", repeats, 1), ("max_examples", max_examples, 2)):
        if count < least:
            raise ConfigError(f"{name} must be an integer of at least {least}; got {count}")
    limit = int(max_batch_size or sizes[-1])
    if limit < sizes[0]:
        raise ConfigError(f"max_batch_size {limit} is below the smallest batch size {sizes[0]}")
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    loss = resolve_loss(loss_fn)
    optimizer_fn = optimizer_fn or optimizer_factory("sgd", 0.01)
    x_cpu, y_cpu = data_tensors(data, max_examples)
    models = _Models(model_fn, weights, optimizer_fn, dev, seed)
    x, y = x_cpu.to(dev), y_cpu.to(dev)
    batch = _batch_of(x, y)
    probe = models.parts()
    with torch.no_grad(), torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        value: Any = loss(probe.model(x[:2]), y[:2])
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ConfigError(f"loss_fn must return a scalar (a mean-reduced loss, e.g. reduction='mean'); it "
                          f"returned {shape}")
    base_lr = float(base_lr if base_lr is not None else probe.optimizer.param_groups[0]["lr"])
    base_batch_size = int(base_batch_size or sizes[0])
    rule = lr_rule or ("linear" if isinstance(probe.optimizer, torch.optim.SGD) else "sqrt")
    generator = torch.Generator().manual_seed(seed)
    notes: list[str] = []

    # Every random draw of the user's model (dropout) comes from a forked, seeded global RNG: the results
    # repeat, and the caller's RNG state is as it was.
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        # --- the largest batch that fits (CPU with a budget: the memory model, fitted from accounted peaks at
        # the smallest sizes, decides)
        fit = None
        if dev.type != "cuda" and budget is not None:
            fit_sizes = [b for b in sizes if b <= limit][:4]
            if len(fit_sizes) < 2:
                fit_sizes = [sizes[0], 2 * sizes[0]]
            fit = fit_memory(fit_sizes, [step_memory(probe, *batch(b), loss).peak_bytes for b in fit_sizes])
        search = largest_batch_size(probe, None, memory_budget=budget, start=sizes[0], limit=limit,
                                    safety_margin=safety_margin, fit=fit, batch_fn=batch, loss_fn=loss)
        del probe
        safe = search.safe_batch_size if search.largest_batch_size < limit else limit
        if search.largest_batch_size == 0:
            raise ConfigError(f"not even a batch of {search.sizes_tried[-1]} fits in memory"
                              + (f" (budget {budget} bytes)" if budget else "") + "; raise the memory budget")

        # --- memory and throughput at each batch size (a batch beyond the safe size: its accumulation plan)
        rows = []
        with memory_cap(budget, dev), torch_threads(threads if dev.type == "cpu" else None):
            for b in sizes:
                plan = accumulation_plan(b, safe if b > safe else b)
                row: dict[str, Any] = {"batch_size": b, "micro_batch_size": plan.micro_batch_size,
                                       "accumulation_steps": plan.accumulation_steps}
                with _quiet_oom(row, dev):
                    row.update(_memory_and_time(models, batch, b, plan.micro_batch_size, loss, dev, warmup, repeats,
                                                min_seconds))
                rows.append(row)
        table = pd.DataFrame(rows)
        one_pass = table[(table["status"] == "ok") & (table["accumulation_steps"] == 1)]
        if fit is None and len(one_pass) >= 2:  # for the record (with a CPU budget, the fit that decided stays)
            fit = fit_memory(one_pass["batch_size"].tolist(), one_pass["peak_bytes"].tolist())

        # --- the noise scale at the given weights, and optionally along training
        model = models.model()
        b_simple, interval, method, fallback = _noise_at_weights(
            model, x[:noise_examples], y[:noise_examples], loss, b_big=min(safe, 128), generator=generator,
            n_bootstrap=n_bootstrap, n_draws=n_draws)
        del model
        history = (_noise_along_training(models, x, y, loss, base_batch_size, train_steps, generator)
                   if train_steps > 0 else None)
        if fallback:
            notes.append(f"exact per-example gradients could not run ({fallback}); used the two-batch estimator")

        # --- the recommendation
        if not 0 < b_simple < math.inf:
            notes.append(f"B_simple is {b_simple:.3g} at these weights (the measured mean gradient is mostly noise): "
                         f"recommended by throughput alone; measure at trained weights or on more examples")
            efficiency_scale = math.inf
        else:
            efficiency_scale = b_simple
        ranked = time_to_target(table, b_noise=efficiency_scale if math.isfinite(efficiency_scale) else 1e300)
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
                  noise_fallback=fallback, noise_examples=min(noise_examples, len(x)),
                  largest_batch_size=search.largest_batch_size, safe_batch_size=safe, search=search,
                  memory_budget=budget, memory_fit=fit, device=str(dev), table=table, noise_history=history,
                  notes=tuple(notes))
