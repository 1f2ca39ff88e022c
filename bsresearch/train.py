"""`run(cfg, run_dir)`: one training run, the whole experiment, top to bottom.

The one setup (runsetup.py) resolves what the config names (a built-in model, dataset and loss, or the
user's own given as FILE.py:NAME) and checks it with one batch (forward, loss, backward), so that
everything that can be wrong with the input fails before any work, as one ConfigError; it gives the run's
member its state, resumed where a checkpoint allows. Then the one training loop (loop.py) trains it with
the single-model engine (engine.py) and the callbacks a run has (callbacks.py): evaluation, divergence,
checkpoints and resume, the noise-scale EMA, progress, and the run directory. The path from the config to
the finished run is the one driver's (driver.py), which a device group's processes and a fused group share.

Conventions (docs/design.md#conventions):
- batch size = examples per optimizer update; micro-batches only split the work (gradient accumulation);
- the loss is a mean over the batch (cross-entropy unless the config names another);
- the learning rate at each step is `schedule.lr_at(cfg, step, n_train)`, nothing else sets it;
- init, data order and measurement probes draw from separate generators (runtime.Generators).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn as nn

from . import config as C
from .config import RunConfig
from .data import dataset_for
from .driver import Place, drive
from .engine import ModelEngine
from .loop import Callback, RunResult
from .models import model_for
from .rundir import RunDir
from .state import load_checkpoint

__all__ = ["RunResult", "load_trained_model", "run"]


def run(cfg: RunConfig, run_dir: str | Path | None = None, progress: bool | None = None,
        overwrite: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Train `cfg` and write its run directory; the whole experiment, top to bottom. `callbacks` are added to
    the run's own (loop.Callback; e.g. callbacks.AtSteps for a measurement along training).

    Bad configuration raises ConfigError before any work (and before the run directory is written).
    Failures during work (NaN or exploding loss, out of memory, any other exception) end the run with
    state diverged/oom/failed, recorded in status.json; they are returned, not raised. A run directory
    that already holds a finished run is returned as is (unless overwrite); one with a resumable
    checkpoint continues from it exactly. With `devices` > 1 the run trains on that many processes
    (devices.launch.run_on_devices: started here, or joining the group torchrun or srun started), each
    through the same driver as a run on one device.
    """
    if cfg.devices > 1:
        from .devices.launch import run_on_devices
        return run_on_devices(cfg, run_dir, progress, overwrite, callbacks)
    return drive(cfg, run_dir, Place.single(), lambda setup, member: ModelEngine(setup.data, setup.loss, setup.task),
                 progress, overwrite, callbacks)


def load_trained_model(run_dir: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, RunConfig]:
    """Rebuild a run's model from its config.json and load its final weights from checkpoint.pt."""
    rd = RunDir(run_dir)
    if not rd.checkpoint_path.exists():
        raise FileNotFoundError(f"{rd.checkpoint_path} does not exist (was the run saved with save_checkpoint?)")
    cfg = RunConfig.from_dict({k: v for k, v in rd.config().items() if k != "derived"})
    data = None if C.is_reference(cfg.model) else dataset_for(cfg, "cpu")  # a built-in model's input shape
    model = model_for(cfg, data, torch.Generator())
    model.load_state_dict(load_checkpoint(rd.checkpoint_path)["state"]["model"])
    return model.to(device), cfg
