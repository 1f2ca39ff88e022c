"""bsresearch: how batch size shapes training speed, GPU cost and generalization.

The public API is re-exported here; see README.md and docs/ for the workflow and docs/design.md for the layout.
Importing the package does not import torch until a torch-using name is accessed, so analysis code
(results, plots) stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from .config import ConfigError, RunConfig, accumulation_steps, run_id  # noqa: E402
from .schedule import eval_steps, lr_at, scaled_lr, steps_per_epoch, total_steps, warmup_steps  # noqa: E402

# name -> module that defines it (imported on first access: these modules import torch)
_LAZY = {
    "Dataset": "data", "DatasetUnavailable": "data", "load_dataset": "data", "dataset_for": "data",
    "BatchSampler": "data", "build_model": "models", "GhostBatchNorm": "models",
    "TrainState": "state", "RunResult": "loop", "run": "train", "train_next_batch": "engine", "evaluate": "engine",
    "new_state": "state", "load_trained_model": "train",
    "resolve_device": "runtime", "make_generator": "runtime",
    "RunDir": "rundir",
    # the gradient noise scale (bsresearch.noise.*) and the other measurements (bsresearch.measure.*)
    "gradient_noise_scale": "noise.exact", "two_batch_noise_scale": "noise.pairs",
    "hessian_noise_scale": "noise.hessian", "fit_critical_batch": "measure.critical",
    "top_eigenvalues": "measure.curvature", "hessian_trace": "measure.curvature",
    "spectral_density": "measure.curvature", "keskar_sharpness": "measure.sharpness",
    "worst_case_sharpness": "measure.sharpness", "average_case_sharpness": "measure.sharpness",
    "interpolate": "measure.landscape",
    # systems
    "measure_throughput": "systems", "measure_memory": "systems", "largest_batch_size": "systems",
    "accumulation_plan": "systems", "recommend_batch_size": "systems", "model_workload": "systems",
    # a user's own training loop (`from bsresearch.advise import advise` for the advice: the name is its package's)
    "NoiseScaleTracker": "noise.tracker",
    # sweeps and results
    "run_sweep": "sweep", "load_spec": "sweep", "SweepSpec": "sweep",
}
# subpackages and torch-free modules, imported on first access; the reproductions' analyses are
# bsresearch.findings.<name>, one module per finding (bsresearch/findings/__init__.py lists them)
_SUBMODULES = ("results", "stats", "plots", "findings", "measure", "systems", "sweep", "noise")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'bsresearch' has no attribute {name!r}")


__all__ = ["__version__", "ConfigError", "RunConfig", "accumulation_steps", "eval_steps", "lr_at", "run_id",
           "scaled_lr", "steps_per_epoch", "total_steps", "warmup_steps", *_LAZY]
