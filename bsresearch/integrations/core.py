"""The measuring core that a plain loop, the Hugging Face Trainer and Lightning share: one row per optimizer
update with the gradient noise scale (for free where the trainer computes two batch sizes) and, every
`sharpness_every` updates, the curvature that stability is read against. Framework-free: an adapter (hf.py,
lightning.py, or a plain loop) tells the Meter where each micro-batch begins, how the trainer weighted it in
its loss, and when the update is about to be applied.

    meter = Meter(model, optimizer, loss, MeterOptions(out_dir="bsresearch", sharpness_every=50), probe=batch)
    meter.start()
    for batch in loader:
        for micro in micro_batches(batch):
            meter.micro_batch(micro, units(micro))      # before its backward
            (loss(model, micro) / k).backward()
        meter.before_update([1 / k] * k)                # the trainer's weight of each micro-batch's mean loss
        optimizer.step(); optimizer.zero_grad()
    meter.finish()

The noise scale of a row (`estimator`):

- micro_batch: k >= 2 micro-batches. The trainer's accumulated gradient is sum_i c_i g_i, g_i micro-batch i's
  mean-loss gradient (its size n_i units) and c_i its weight (1/k, or n_i / N where the loss is summed over
  tokens and divided by the N tokens of the whole batch), times a GradScaler's scale s. The hooks give
  |c_i s g_i|^2 and |s sum c_i g_i|^2 (gradients.py). Small: the mean of |g_i|^2, whose expectation is
  |G|^2 + tr(Sigma) / b_small with b_small the harmonic mean of the n_i; big: the normalised accumulated
  gradient sum c_i g_i / sum c_i, whose expectation is |G|^2 + tr(Sigma) / b_big with
  b_big = (sum c_i)^2 / sum (c_i^2 / n_i) (the N tokens for a token sum over N; k b_small for a mean of means).
- devices: under DDP, each device's gradient before the all-reduce (the communication hook
  bsresearch.noise.device.gradient_norms_hook) against the averaged gradient; the devices' own (c, n) combine
  as the micro-batches do, through one all-reduce of 6 numbers per update.
- two_batch: one micro-batch on one device: every `noise_every` updates, the gradient of the batch's first half
  at the same weights (one extra forward and backward over half a batch, inside a forked RNG, BatchNorm
  buffers restored, .grad untouched) against the batch's.

Rows: step (the update, from 1), examples and tokens (global, cumulative), lr, unit, b_small, b_big,
grad_sq_norm, trace_cov, b_simple (this update's), b_simple_ema, estimator, train_loss, sharpness,
sharpness_limit, preconditioned_sharpness, batch_sharpness, probe_loss (stability.py has the formulas).
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ..config import ConfigError
from ..measure.functional import measuring
from ..measure.stability import base_optimizer, batch_sharpness, sharpness_limit, stability_curvature, trainable
from ..noise.meter import NoiseMeter
from ..rundir import RunDir
from .batches import Units, UnitsFn, part, to_device
from .ending import EndWatch
from .gradients import GradientWatch

if TYPE_CHECKING:
    import pandas as pd

    from ..noise.device import GradientNorms
    from ..runwriter import RunWriter

BatchLoss = Callable[[nn.Module, Any], torch.Tensor]   # (model, batch) -> the batch's mean loss, a 0-d tensor
UNSUPPORTED = ("stop", "continue")   # MeterOptions.unsupported: what a training it cannot measure does
COLUMNS = ("step", "examples", "tokens", "lr", "unit", "b_small", "b_big", "grad_sq_norm", "trace_cov", "b_simple",
           "b_simple_ema", "estimator", "train_loss", "sharpness", "sharpness_limit", "preconditioned_sharpness",
           "batch_sharpness", "probe_loss")


@dataclass(frozen=True)
class MeterOptions:
    """What the callbacks take. out_dir: where history.csv, summary.md and history.png go. sharpness_every:
    updates between curvature measurements (0: none). noise_every: updates between two-batch estimates where
    the trainer gives no free pair (0: none). probe_size: examples of the fixed probe batch (default: the
    trainer's micro-batch). run_dir: also write bsresearch's run-directory format there (a sweep of one's own
    notebook), with `parameters` as its config.json. unsupported: "stop" (default) refuses a training it cannot
    measure before the first step; "continue" says so in one line and trains without measuring."""
    out_dir: Path | None = None
    sharpness_every: int = 0
    noise_every: int = 1
    ema_decay: float = 0.95
    probe_size: int | None = None
    seed: int = 0
    lanczos_tol: float = 1e-3
    lanczos_max_iter: int = 20
    run_dir: Path | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    write_every: int = 50
    unsupported: str = "stop"

    def __post_init__(self) -> None:
        for name in ("sharpness_every", "noise_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a whole number of optimizer steps >= 0 (0: off); got {value!r}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"ema_decay must be in [0, 1); got {self.ema_decay!r}")
        if self.probe_size is not None and self.probe_size < 1:
            raise ConfigError(f"probe_size must be a positive number of examples; got {self.probe_size!r}")
        if self.write_every < 1:
            raise ConfigError(f"write_every must be a positive number of rows; got {self.write_every!r}")
        if self.unsupported not in UNSUPPORTED:
            raise ConfigError(f"unsupported must be one of {', '.join(UNSUPPORTED)}; got {self.unsupported!r}")


def effective_sizes(weights: Sequence[float], sizes: Sequence[float]) -> tuple[float, float]:
    """(b_small, b_big) for small batches of `sizes` units, each weighted `weights[i]` in the big batch's
    gradient: the harmonic mean of the sizes, and (sum w)^2 / sum (w^2 / n) (module docstring)."""
    if len(weights) != len(sizes) or not sizes:
        raise ValueError(f"need one weight per size; got {len(weights)} weights and {len(sizes)} sizes")
    b_small = len(sizes) / sum(1 / n for n in sizes)
    b_big = sum(weights) ** 2 / sum(w * w / n for w, n in zip(weights, sizes))
    return b_small, b_big


@dataclass
class _Step:
    """What one update has seen so far: its micro-batches (batch, units, mean loss)."""
    batches: list[Any] = field(default_factory=list)
    units: list[Units] = field(default_factory=list)
    losses: list[torch.Tensor | None] = field(default_factory=list)


class Meter:
    """One training run's measurements (module docstring). `loss(model, batch)` is the trainer's mean loss of a
    batch (its curvature and the two-batch estimate are of it); `units(batch)` its size; `probe` the fixed
    probe batch (on any device; moved to the model's). `norms`: the DDP communication hook's state, when the
    trainer is data parallel (the adapter registers the hook)."""

    def __init__(self, model: nn.Module, optimizer: object, loss: BatchLoss, units: UnitsFn, options: MeterOptions,
                 probe: Any = None, norms: GradientNorms | None = None) -> None:
        self.model, self.optimizer, self.loss, self.units_of, self.options = model, optimizer, loss, units, options
        self.norms = norms
        self.world = dist.get_world_size() if norms is not None and dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.device = next(model.parameters()).device
        self.probe = to_device(probe, self.device) if probe is not None else None
        self.noise = NoiseMeter(options.ema_decay)
        self.watch: GradientWatch | None = None
        self.rows: list[dict[str, Any]] = []
        self.step = 0            # updates applied so far
        self.examples = 0        # global, cumulative
        self.tokens = 0
        self.token_level = False
        self.current = _Step()
        self.active = True
        self.busy = False        # inside bsresearch's own passes (adapters' forward hooks ignore them)
        self.writer: RunWriter | None = None
        self.ending: EndWatch | None = None   # with a run directory: records a training that ends by raising
        self._logged_to_run = 0
        self._said_no_total = False

    # ----------------------------------------------------------------------------- lifecycle
    def refuse(self, problems: Sequence[str]) -> bool:
        """Say what cannot be measured, in one line; raise ConfigError unless options.unsupported is
        "continue" (then the meter goes quiet and training runs unmeasured). Returns whether it can measure."""
        if not problems:
            return True
        line = f"bsresearch cannot measure this training: {'; '.join(problems)}"
        if self.options.unsupported == "stop":
            raise ConfigError(f"{line} (pass unsupported='continue' to train without the measurements)")
        print(f"{line}; training continues without them (unsupported='continue')", file=sys.stderr)
        self.active = False
        if self.watch is not None:   # found after the start (a model that returns no loss): stop reading
            self.watch.remove()
            self.watch = None
        return False

    def start(self) -> None:
        """Install the gradient hooks (without DDP; with it the communication hook reads the gradients) and
        open the run directory when one is given."""
        if not self.active:
            return
        if self.norms is None:
            self.watch = GradientWatch(self.model)
        if self.options.run_dir is not None and self.rank == 0:
            from ..runwriter import RunWriter
            self.writer = RunWriter(self.options.run_dir, self.options.parameters).start()
            self.ending = EndWatch(self.fail)
            self.ending.arm()

    def micro_batch(self, batch: Any, units: Units | None = None, loss: torch.Tensor | None = None,
                    last: bool | None = None) -> None:
        """A micro-batch begins (call before its backward): its batch (held until the update, for the two-batch
        estimate and the batch sharpness), its units (default units(batch)) and, when known, its mean loss, and
        whether its backward is the update's last (then only that backward reads the accumulated gradient's
        norm; None: every backward does)."""
        if not self.active:
            return
        units = units or self.units_of(batch)
        self.token_level = self.token_level or units.tokens is not None
        self.current.batches.append(batch)
        self.current.units.append(units)
        self.current.losses.append(loss)
        if self.watch is not None:
            self.watch.begin_micro_batch(last)

    def set_loss(self, loss: torch.Tensor) -> None:
        """The mean loss of the micro-batch begun last (a framework that gives it after the forward pass)."""
        if self.active and self.current.losses:
            self.current.losses[-1] = loss.detach()

    # ----------------------------------------------------------------------------- one update
    def before_update(self, weights: Sequence[float] | None = None, grad_scale: float = 1.0) -> dict[str, Any] | None:
        """The update's row, before the optimizer applies it (same weights as its gradients). weights[i]: the
        trainer's weight of micro-batch i's mean loss in the loss it differentiated (default 1/k each);
        grad_scale: a GradScaler's scale (the hooks see scaled gradients). Returns the row (None when quiet)."""
        if not self.active:
            return None
        step, self.current = self.current, _Step()
        k = len(step.units)
        if k == 0:   # an update with no micro-batch seen (a skipped step): no row
            if self.watch is not None:
                self.watch.discard()
            return None
        weights = list(weights) if weights is not None else [1.0 / k] * k
        if len(weights) != k:
            raise ValueError(f"need one weight per micro-batch; got {len(weights)} for {k}")
        sizes = [float(u.size) for u in step.units]
        row: dict[str, Any] = {"step": self.step + 1}
        noise, totals = self._noise(step, weights, sizes, grad_scale)
        self.examples += int(totals[0])
        self.tokens += int(totals[1])
        row.update(examples=self.examples, tokens=self.tokens if self.token_level else math.nan,
                   lr=_lr(self.optimizer), unit="tokens" if self.token_level else "examples")
        row.update(noise)
        row["train_loss"] = _weighted_loss(step.losses, weights)
        row.update(self._curvature(step, weights))
        self.rows.append(row)
        self.step += 1
        self._write_if_due()
        return row

    def _noise(self, step: _Step, weights: list[float], sizes: list[float],
               grad_scale: float) -> tuple[dict[str, Any], tuple[float, float]]:
        """The row's noise columns and (examples, tokens) of the update over every device."""
        examples = float(sum(u.examples for u in step.units))
        tokens = float(sum(u.tokens or 0 for u in step.units))
        empty = {"b_small": math.nan, "b_big": math.nan, "grad_sq_norm": math.nan, "trace_cov": math.nan,
                 "b_simple": math.nan, "b_simple_ema": self.noise.b_simple, "estimator": ""}
        if self.norms is not None:
            return self._devices(weights, sizes, grad_scale, examples, tokens, empty)
        assert self.watch is not None
        micro, total = self.watch.take()
        if not math.isfinite(total):   # a gradient not finite, or a last micro-batch the trainer said was not
            if not self._said_no_total:
                self._said_no_total = True
                print(f"bsresearch: update {self.step + 1}: the accumulated gradient's norm is not finite or was "
                      f"not read at the update's last backward; such updates get no noise scale", file=sys.stderr)
            return empty, (examples, tokens)
        if len(micro) != len(sizes):
            raise RuntimeError(f"{len(micro)} backward passes for {len(sizes)} micro-batches this update: call "
                               f"micro_batch() once before each micro-batch's backward")
        c = sum(weights)
        sq_big = total / (c * grad_scale) ** 2
        if len(sizes) >= 2:
            sq_small = sum(s / (w * grad_scale) ** 2 for s, w in zip(micro, weights)) / len(micro)
            b_small, b_big = effective_sizes(weights, sizes)
            sample = self.noise.pair(sq_small, sq_big, b_small, b_big, estimator="micro_batch", step=self.step + 1)
        elif self.options.noise_every and self.step % self.options.noise_every == 0 and step.units[0].examples >= 2:
            sample = self._two_batch(step.batches[0], sizes[0], sq_big)
            if sample is None:
                return empty, (examples, tokens)
        else:
            return empty, (examples, tokens)
        return _noise_columns(sample), (examples, tokens)

    def _two_batch(self, batch: Any, size: float, sq_big: float) -> Any:
        """The two-batch estimate on the update's one batch: its first half's gradient at the same weights
        (None where the half holds no unit or all of them)."""
        half = part(batch, self.units_of(batch).examples // 2)
        b_half = float(self.units_of(half).size)
        if not 0 < b_half < size:
            return None
        with self._own_pass(), measuring(self.model, "train" if self.model.training else "eval"):
            params = trainable(self.model)
            grads = torch.autograd.grad(self.loss(self.model, half), params, allow_unused=True)
            sq_small = float(sum(torch.dot(g.reshape(-1).float(), g.reshape(-1).float()) for g in grads
                                 if g is not None))
        return self.noise.pair(sq_small, sq_big, b_half, size, estimator="two_batch", step=self.step + 1)

    def _devices(self, weights: list[float], sizes: list[float], grad_scale: float, examples: float, tokens: float,
                 empty: dict[str, Any]) -> tuple[dict[str, Any], tuple[float, float]]:
        """Data parallel: this device's (c, n) as for micro-batches, then one all-reduce of six numbers."""
        assert self.norms is not None
        local = float(self.norms.local) if self.norms.local is not None else math.nan
        reduced = float(self.norms.reduced) if self.norms.reduced is not None else math.nan
        self.norms.reset(self.device)
        c = sum(weights)
        b_device = effective_sizes(weights, sizes)[1]
        mine = torch.tensor([local / (c * grad_scale) ** 2, 1 / b_device, c, c * c / b_device, examples, tokens],
                            dtype=torch.float64, device=self.device)
        dist.all_reduce(mine)
        sq_small_sum, inv_b, c_sum, c2_over_b, examples, tokens = mine.tolist()
        if self.world < 2 or not math.isfinite(reduced):
            return empty, (examples, tokens)
        sq_big = reduced / (c_sum / self.world * grad_scale) ** 2
        sample = self.noise.devices(sq_small_sum / self.world, sq_big, self.world / inv_b, c_sum ** 2 / c2_over_b,
                                    step=self.step + 1)
        return _noise_columns(sample), (examples, tokens)

    def _curvature(self, step: _Step, weights: list[float]) -> dict[str, Any]:
        """Every sharpness_every updates (from the first): the probe batch's sharpness and, for Adam, its
        preconditioned sharpness; the update's batch sharpness. NaN in between."""
        out: dict[str, Any] = {"sharpness": math.nan, "sharpness_limit": sharpness_limit(self.optimizer),
                               "preconditioned_sharpness": math.nan, "batch_sharpness": math.nan,
                               "probe_loss": math.nan}
        every = self.options.sharpness_every
        if not every or self.step % every or self.probe is None:
            return out
        probe = self.probe
        generator = torch.Generator().manual_seed(self.options.seed)
        with self._own_pass():
            curvature = stability_curvature(self.model, lambda: self.loss(self.model, probe), self.optimizer,
                                            self.options.lanczos_tol, self.options.lanczos_max_iter, generator)
        with self._own_pass():
            total = sum(weights)

            def batch_loss() -> torch.Tensor:
                return sum((w / total) * self.loss(self.model, b) for w, b in zip(weights, step.batches))  # type: ignore[return-value]
            out["batch_sharpness"] = batch_sharpness(self.model, batch_loss)
        out.update(sharpness=curvature.sharpness, preconditioned_sharpness=curvature.preconditioned_sharpness,
                   probe_loss=curvature.loss)
        return out

    class _OwnPass:
        def __init__(self, meter: Meter) -> None:
            self.meter = meter
            self.rng = torch.random.fork_rng(devices=[meter.device] if meter.device.type == "cuda" else [])

        def __enter__(self) -> None:
            self.meter.busy = True
            if self.meter.watch is not None:
                self.meter.watch.paused = True
            self.rng.__enter__()

        def __exit__(self, *exc: Any) -> None:
            self.rng.__exit__(*exc)
            self.meter.busy = False
            if self.meter.watch is not None:
                self.meter.watch.paused = False

    def _own_pass(self) -> Meter._OwnPass:
        """bsresearch's own forward and backward passes: the gradient hooks paused, inside a forked RNG."""
        return Meter._OwnPass(self)

    # ----------------------------------------------------------------------------- results
    @property
    def history(self) -> pd.DataFrame:
        import pandas as pd
        return pd.DataFrame(self.rows, columns=list(dict.fromkeys([*COLUMNS, *(k for r in self.rows for k in r)])))

    def annotate(self, **values: Any) -> None:
        """Add values (an evaluation's metrics) to the latest row."""
        if self.rows:
            self.rows[-1].update(values)

    def _write_if_due(self) -> None:
        if len(self.rows) % self.options.write_every == 0:
            self.write()
        self._log_to_run(len(self.rows) - 1)   # the latest row may still be annotated

    def write(self) -> None:
        """history.csv in out_dir (rank 0 only)."""
        if self.rank == 0 and self.options.out_dir is not None:
            RunDir(self.options.out_dir).write_history(self.history.to_dict("records"))

    def finish(self, metrics: dict[str, Any] | None = None) -> None:
        """At the end of training: history.csv, summary.md and history.png in out_dir, and the run directory's
        last rows, metrics and status."""
        if not self.active:
            return
        if self.watch is not None:
            self.watch.remove()
            self.watch = None
        if self.ending is not None:
            self.ending.disarm()
        if self.norms is not None:   # DDP's threads let go of the hook's callbacks before the user's script ends
            self.norms.settle()
        if self.rank != 0:
            return
        self.write()
        final = {"steps": self.step, "examples": self.examples, "b_simple_ema": self.noise.b_simple,
                 **({"tokens": self.tokens} if self.token_level else {}), **(metrics or {})}
        if self.options.out_dir is not None and self.rows:
            from .summary import write_summary
            write_summary(self.history, self.options.out_dir)
        if self.writer is not None:
            self._log_to_run(len(self.rows))
            last = {k: v for k, v in (self.rows[-1] if self.rows else {}).items() if k not in final}
            self.writer.finish(**{**last, **final})

    def fail(self, error: BaseException | str) -> None:
        """Training raised (or ended unseen, `error` then saying how): the history so far, and the run
        directory's status failed under the error's name."""
        if self.ending is not None:
            self.ending.disarm()
        if self.rows:
            self.write()
        if self.writer is not None:
            self._log_to_run(len(self.rows))   # every finished update's row, the last one too
            self.writer.fail(error)

    def _log_to_run(self, upto: int) -> None:
        """Pass the run directory's writer the rows before row `upto` that it has not had yet."""
        if self.writer is not None:
            for row in self.rows[self._logged_to_run:upto]:
                self.writer.log(**row)
            self._logged_to_run = max(self._logged_to_run, upto)


def _noise_columns(sample: Any) -> dict[str, Any]:
    row = sample.row()
    row.pop("step", None)
    return row


def _weighted_loss(losses: Sequence[torch.Tensor | None], weights: Sequence[float]) -> float:
    """The update's mean loss from its micro-batches' mean losses (NaN where one is unknown)."""
    if not losses or any(loss is None for loss in losses):
        return math.nan
    values = torch.stack([loss.float() for loss in losses if loss is not None]).tolist()
    return sum(w * v for w, v in zip(weights, values)) / sum(weights)


def _lr(optimizer: object) -> float:
    opt = base_optimizer(optimizer)
    return float(opt.param_groups[0]["lr"]) if opt is not None and opt.param_groups else math.nan
