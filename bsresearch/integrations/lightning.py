"""Lightning's adapter: `BatchSizeCallback`, a pytorch_lightning Callback on the Meter (core.py).

    trainer = pl.Trainer(accumulate_grad_batches=2, callbacks=[BatchSizeCallback(sharpness_every=50)])
    trainer.fit(module, loader)
    callback.history            # one row per optimizer step; also in the log folder's bsresearch/history.csv

Where it reads what (Lightning 2.x, automatic optimization): each micro-batch begins at on_train_batch_start,
which gives the batch; its gradient is read by the gradient hooks (gradients.py) during Lightning's backward;
Lightning divides each micro-batch's loss by accumulate_grad_batches (also in an epoch's last, shorter
accumulation); on_before_optimizer_step comes after the last backward and before clipping; a GradScaler's
scale is the precision plugin's. Under DDP the communication hook goes on trainer.strategy.model. The
loss of the probe batch and of the two-batch estimate is the module's training_step (its self.log calls
silenced while bsresearch runs it), or `loss(module, batch)` where given.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

try:
    import pytorch_lightning as pl
except ImportError:  # one line, naming the extra
    raise ImportError("bsresearch.integrations.lightning needs Lightning: "
                      "pip install 'bsresearch[lightning]'") from None

from . import checks
from .batches import Units, UnitsFn, count_examples, probe_batch
from .core import BatchLoss, Meter, MeterOptions

__all__ = ["BatchSizeCallback", "training_step_loss"]


def training_step_loss(module: nn.Module, batch: Any) -> torch.Tensor:
    """The LightningModule's own loss of a batch: its training_step's tensor (or its "loss"), with the module's
    log and log_dict silenced for the call (bsresearch's passes are not training steps)."""
    quiet = {"log": lambda *a, **k: None, "log_dict": lambda *a, **k: None}
    saved = {name: module.__dict__.get(name) for name in quiet}
    module.__dict__.update(quiet)
    try:
        out = module.training_step(batch, 0)  # type: ignore[operator]
    finally:
        for name, value in saved.items():
            if value is None:
                module.__dict__.pop(name, None)
            else:
                module.__dict__[name] = value
    loss = out.get("loss") if isinstance(out, dict) else out
    if not isinstance(loss, torch.Tensor):
        raise ValueError("training_step returned no loss tensor: pass loss=, the mean loss of a batch")
    return loss


def examples_units(batch: Any) -> Units:
    return Units(count_examples(batch))


class BatchSizeCallback(pl.Callback):
    """The gradient noise scale (for free under accumulate_grad_batches and DDP) and the sharpness along a
    Lightning training (docs/own-trainer.md). The options are the Hugging Face callback's (hf.py); out_dir
    defaults to the trainer's log folder's bsresearch/; units(batch) (default: examples) says the batch's size
    where the loss averages over tokens."""

    def __init__(self, out_dir: str | Path | None = None, sharpness_every: int = 0, noise_every: int = 1,
                 ema_decay: float = 0.95, probe_size: int | None = None, seed: int = 0,
                 run_dir: str | Path | None = None, parameters: dict[str, Any] | None = None,
                 unsupported: str = "stop", loss: BatchLoss | None = None, units: UnitsFn | None = None,
                 log: bool = True) -> None:
        super().__init__()
        self.options = MeterOptions(out_dir=Path(out_dir) if out_dir is not None else None,
                                    sharpness_every=sharpness_every, noise_every=noise_every, ema_decay=ema_decay,
                                    probe_size=probe_size, seed=seed,
                                    run_dir=Path(run_dir) if run_dir is not None else None,
                                    parameters=dict(parameters or {}), unsupported=unsupported)
        self.user_loss, self.units, self.log = loss, units or examples_units, log
        self.meter: Meter | None = None
        self._pending: dict[str, Any] | None = None

    @property
    def history(self) -> Any:
        """The rows so far as a pandas DataFrame (one per optimizer step)."""
        import pandas as pd
        return self.meter.history if self.meter is not None else pd.DataFrame()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        import dataclasses
        options = self.options
        if options.out_dir is None:
            folder = Path(trainer.log_dir or trainer.default_root_dir)
            options = dataclasses.replace(options, out_dir=folder / "bsresearch")
        loader = trainer.train_dataloader
        loader = loader if isinstance(loader, torch.utils.data.DataLoader) else None
        problems = self._problems(trainer, pl_module, loader)
        probe = None
        if options.sharpness_every and loader is not None and not problems:
            size = options.probe_size or loader.batch_size or 1
            probe = probe_batch(loader, size, options.seed)
        norms = None
        wrapped = trainer.strategy.model
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel) and not problems:
            from ..noise.device import GradientNorms, gradient_norms_hook
            norms = GradientNorms(trainer.world_size)
            wrapped.register_comm_hook(norms, gradient_norms_hook)
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.meter = Meter(pl_module, optimizer, self.user_loss or training_step_loss, self.units, options, probe,
                           norms)
        if self.meter.refuse(problems):
            self.meter.start()

    def _problems(self, trainer: pl.Trainer, module: pl.LightningModule, loader: Any) -> list[str]:
        problems = checks.fsdp(module) + checks.model_parallel(module) + checks.loader_batch(loader)
        strategy = type(trainer.strategy).__name__
        if "FSDP" in strategy:
            problems.append(f"FSDP shards the gradients ({checks.SHARDED})")
        if "DeepSpeed" in strategy:
            config = getattr(trainer.strategy, "config", None) or {}
            problems += checks.deepspeed_stage(config.get("zero_optimization", {}).get("stage"))
        if "ModelParallel" in strategy:
            problems.append("ModelParallelStrategy splits the model: the noise scale and the Hessian need one "
                            "process to hold the whole model; use DDP")
        if not module.automatic_optimization:
            problems.append("manual optimization: the callback follows Lightning's own optimizer step; measure a "
                            "manual loop with bsresearch.integrations.core.Meter")
        if len(trainer.optimizers) > 1:
            problems.append(f"{len(trainer.optimizers)} optimizers: the callback measures one")
        if loader is None and self.options.sharpness_every:
            problems.append("the training data is not one DataLoader, so no probe batch can be drawn from it: "
                            "pass sharpness_every=0")
        return problems

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self.meter is not None:
            self.meter.micro_batch(batch, last=_steps_after(trainer))

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor) -> None:
        if self.meter is not None:   # Lightning divided the micro-batch's mean loss by accumulate_grad_batches
            self.meter.set_loss(loss.detach() * trainer.accumulate_grad_batches)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        meter = self.meter
        if meter is None or not meter.active:
            return
        k = len(meter.current.units)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
        self._pending = meter.before_update([1 / trainer.accumulate_grad_batches] * k, scale)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """The row to log_dict at the trainer's logging steps (log_every_n_steps) and at each curvature measurement:
        Lightning's logging costs ~0.1 s a call of 15 values (measured), 20% of a small model's step."""
        row, self._pending = self._pending, None
        if row is None or not self.log:
            return
        every = max(int(getattr(trainer, "log_every_n_steps", 1) or 1), 1)   # set by Lightning's logger connector
        if trainer.global_step % every and row["sharpness"] != row["sharpness"]:
            return
        values = {f"bsresearch/{k}": float(v) for k, v in row.items()
                  if k not in ("unit", "estimator") and isinstance(v, (int, float)) and v == v}
        pl_module.log_dict(values, on_step=True, on_epoch=False, sync_dist=False, rank_zero_only=True)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.meter is not None and not trainer.sanity_checking:
            self.meter.annotate(**{k: float(v) for k, v in trainer.callback_metrics.items()
                                   if not k.startswith("bsresearch/") and v.numel() == 1})

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.meter is not None:
            self.meter.finish()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if self.meter is not None and isinstance(exception, Exception):
            self.meter.fail(exception)


def _steps_after(trainer: pl.Trainer) -> bool | None:
    """Whether the optimizer steps after this batch (Lightning's own test, on its epoch loop; None where this
    Lightning has none)."""
    should_accumulate = getattr(getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None),
                                "_should_accumulate", None)
    if not callable(should_accumulate):
        return None
    try:
        return not should_accumulate()
    except Exception:   # a Lightning whose loop reads differently: every backward reads the norm
        return None
