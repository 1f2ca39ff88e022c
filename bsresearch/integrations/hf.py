"""The Hugging Face Trainer's adapter: `BatchSizeCallback`, a transformers.TrainerCallback on the Meter (core.py).

    trainer = Trainer(model, args, train_dataset=..., data_collator=...,
                      callbacks=[BatchSizeCallback(sharpness_every=50)])
    trainer.train()
    callback.history            # one row per optimizer step; also in args.output_dir/bsresearch/history.csv

Where it reads what (transformers 4.46 to 5.x; the Trainer runs each micro-batch's forward and backward, then
clips, then calls on_pre_optimizer_step, steps, calls on_optimizer_step and on_step_end):

- each micro-batch: a forward pre-hook on the model (its inputs, in training mode with gradients on, so never
  an evaluation) starts it; a forward hook takes its loss; the gradient hooks (gradients.py) read its gradient
  during the Trainer's own backward, before clipping;
- the Trainer's loss scaling: a micro-batch's loss is divided by the number of micro-batches of the update,
  except where the model was given `num_items_in_batch` (a token-level loss summed and divided by the real
  tokens of the whole update; times the processes under `average_tokens_across_devices`);
- under DDP (torchrun), the communication hook on the Trainer's wrapped model;
- the probe batch: `probe_size` examples of the train dataloader's dataset, collated by its collator.

The Trainer passes its callbacks its arguments, model, optimizer and data loaders, not itself; the callback
finds the Trainer that holds those arguments (through the garbage collector's referrers, once, at the start)
for what only the Trainer knows: its wrapped (DDP) model, its loss settings, DeepSpeed and FSDP.
"""
from __future__ import annotations

import gc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

try:
    from transformers import Trainer, TrainerCallback
except ImportError:  # one line, naming the extra
    raise ImportError("bsresearch.integrations.hf needs transformers: pip install 'bsresearch[hf]'") from None

from . import checks
from .batches import UnitsFn, label_units, probe_batch
from .core import BatchLoss, Meter, MeterOptions

__all__ = ["BatchSizeCallback", "model_loss"]

KEY_PREFIX = "bsresearch/"   # the Trainer's log keys of the measurements


def model_loss(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """The model's own mean loss of a batch (a Hugging Face model given its labels; no num_items_in_batch, so
    the mean over the batch's real tokens, or examples)."""
    outputs = model(**{k: v for k, v in batch.items() if k != "num_items_in_batch"})
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs[0]
    if loss is None:
        raise ValueError("the model returned no loss: its batch has no labels")
    return loss


def find_owner(obj: object, kind: type) -> Any:
    """The object of class `kind` that holds `obj` as an attribute, or None (gc referrers, two levels)."""
    for holder in gc.get_referrers(obj):
        if isinstance(holder, kind):
            return holder
        if isinstance(holder, dict):
            for owner in gc.get_referrers(holder):
                if isinstance(owner, kind) and getattr(owner, "__dict__", None) is holder:
                    return owner
    return None


class BatchSizeCallback(TrainerCallback):
    """The gradient noise scale (for free under gradient accumulation and DDP) and the sharpness along a
    Trainer's training (docs/own-trainer.md).

    out_dir: history.csv, summary.md, history.png (default: output_dir/bsresearch). sharpness_every: optimizer
    steps between curvature measurements (0: off). noise_every: steps between two-batch estimates where the
    training has neither accumulation nor DDP (0: off). probe_size: examples of the probe batch (default the
    per-device batch). run_dir / parameters: also write a bsresearch run directory (a sweep of one's notebook).
    loss(model, batch) / units(batch): the mean loss and size of a batch, where the model's own loss over
    `labels` is not the Trainer's. unsupported: "stop" or "continue" (module docstring of core.py)."""

    def __init__(self, out_dir: str | Path | None = None, sharpness_every: int = 0, noise_every: int = 1,
                 ema_decay: float = 0.95, probe_size: int | None = None, seed: int = 0,
                 run_dir: str | Path | None = None, parameters: dict[str, Any] | None = None,
                 unsupported: str = "stop", loss: BatchLoss | None = None, units: UnitsFn | None = None,
                 log: bool = True) -> None:
        self.options = MeterOptions(out_dir=Path(out_dir) if out_dir is not None else None,
                                    sharpness_every=sharpness_every, noise_every=noise_every, ema_decay=ema_decay,
                                    probe_size=probe_size, seed=seed,
                                    run_dir=Path(run_dir) if run_dir is not None else None,
                                    parameters=dict(parameters or {}), unsupported=unsupported)
        self.user_loss, self.user_units, self.log = loss, units, log
        self.meter: Meter | None = None
        self.trainer: Any = None
        self._handles: list[Any] = []
        self._num_items: list[float | None] = []
        self._pending: dict[str, Any] | None = None

    @property
    def history(self) -> Any:
        """The rows so far as a pandas DataFrame (one per optimizer step)."""
        import pandas as pd
        return self.meter.history if self.meter is not None else pd.DataFrame()

    # ----------------------------------------------------------------------------- start
    def on_train_begin(self, args: Any, state: Any, control: Any, model: nn.Module | None = None,
                       optimizer: Any = None, train_dataloader: Any = None, **kwargs: Any) -> None:
        assert model is not None
        self.trainer = find_owner(args, Trainer)
        options = self.options
        if options.out_dir is None:
            options = _replace(options, out_dir=Path(args.output_dir) / "bsresearch")
        shift = bool(getattr(self.trainer, "_loss_shifts_labels", type(model).__name__.endswith("ForCausalLM")))
        units = self.user_units or label_units(shift)
        problems = self._problems(args, model, train_dataloader)
        probe = None
        if options.sharpness_every and not any("iterable" in p for p in problems):
            size = options.probe_size or int(args.per_device_train_batch_size)
            probe = probe_batch(train_dataloader, size, options.seed)
        norms = None
        wrapped = getattr(self.trainer, "model_wrapped", None)
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and not problems:
            from ..noise.device import GradientNorms, gradient_norms_hook
            norms = GradientNorms(torch.distributed.get_world_size())
            wrapped.register_comm_hook(norms, gradient_norms_hook)
        self.meter = Meter(model, optimizer, self.user_loss or model_loss, units, options, probe, norms)
        if not self.meter.refuse(problems):
            return
        self.meter.start()
        self._handles = [model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
                         model.register_forward_hook(self._after_forward, with_kwargs=True)]

    def _problems(self, args: Any, model: nn.Module, loader: Any) -> list[str]:
        trainer = self.trainer
        problems = checks.fsdp(model) + checks.model_parallel(model) + checks.loader_batch(loader)
        if getattr(trainer, "is_fsdp_enabled", False) or getattr(args, "fsdp", None):
            problems.append(f"FSDP shards the gradients ({checks.SHARDED})")
        plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
        problems += checks.deepspeed_stage(getattr(plugin, "zero_stage", None))
        if getattr(args, "n_gpu", 1) > 1:
            problems.append(f"the Trainer runs DataParallel over {args.n_gpu} GPUs in one process: start one process "
                            f"per GPU with torchrun (DDP)")
        if self.user_loss is None and trainer is not None:
            if getattr(trainer, "compute_loss_func", None) is not None or getattr(trainer, "label_smoother", None):
                problems.append("the Trainer computes its own loss (compute_loss_func or label smoothing), which a "
                                "callback cannot see: pass loss=, the mean loss of a batch")
            elif type(trainer).compute_loss is not Trainer.compute_loss:
                problems.append(f"{type(trainer).__name__} overrides compute_loss, which a callback cannot see: pass "
                                f"loss=, the mean loss of a batch")
        return problems

    # ----------------------------------------------------------------------------- each micro-batch
    def _training(self, module: nn.Module) -> bool:
        meter = self.meter
        return meter is not None and meter.active and not meter.busy and module.training and \
            torch.is_grad_enabled()

    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
        if not self._training(module) or args:
            return
        assert self.meter is not None
        batch = {k: v for k, v in kwargs.items() if k != "num_items_in_batch"}
        items = kwargs.get("num_items_in_batch")
        self._num_items.append(None if items is None else items)
        # the Trainer sets accelerate's sync_gradients before each micro-batch: True on the update's last
        sync = getattr(getattr(self.trainer, "accelerator", None), "sync_gradients", None)
        self.meter.micro_batch(batch, last=sync if isinstance(sync, bool) else None)

    def _after_forward(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], outputs: Any) -> None:
        if not self._training(module) or args:
            return
        assert self.meter is not None
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else None
        if loss is None:
            self.meter.refuse(["the model returns no loss, so the Trainer's loss is not exposed to a callback: give "
                               "the batches labels, or pass loss="])
            return
        items = self._num_items[-1]
        if items is not None:   # the model's loss is summed over tokens and divided by the update's
            units = self.meter.current.units[-1]
            loss = loss.detach() * float(items) / max(units.size, 1)
        self.meter.set_loss(loss)

    # ----------------------------------------------------------------------------- each update
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        meter = self.meter
        if meter is None or not meter.active:
            return
        units = meter.current.units
        items = self._num_items
        self._num_items = []
        first = items[0] if items else None
        if first is not None and all(n is not None for n in items) and units:
            total = float(first)   # the same for each micro-batch of the update
            world = meter.world if getattr(args, "average_tokens_across_devices", False) else 1
            weights = [world * u.size / total for u in units]
        else:
            weights = None
        self._pending = meter.before_update(weights, _grad_scale(kwargs.get("optimizer")))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The row to the Trainer's log at its logging steps (control.should_log, which the Trainer's flow callback
        sets before this one runs) and at every curvature measurement; history.csv has every row."""
        row, self._pending = self._pending, None
        if row is None or not self.log or self.trainer is None:
            return
        if not (control.should_log or row["sharpness"] == row["sharpness"]):
            return
        values = {f"{KEY_PREFIX}{k}": v for k, v in row.items()
                  if k not in ("step", "unit", "estimator") and isinstance(v, (int, float)) and v == v}
        self.trainer.log(values)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                    **kwargs: Any) -> None:
        if self.meter is not None and metrics:
            self.meter.annotate(**{k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.meter is not None:
            self.meter.finish()


def _grad_scale(optimizer: Any) -> float:
    """accelerate's GradScaler scale (fp16 mixed precision), else 1."""
    scaler = getattr(optimizer, "scaler", None)
    if scaler is not None and getattr(scaler, "is_enabled", lambda: False)():
        return float(scaler.get_scale())
    return 1.0


def _replace(options: MeterOptions, **changes: Any) -> MeterOptions:
    import dataclasses
    return dataclasses.replace(options, **changes)
