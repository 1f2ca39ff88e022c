"""Pure measurements of a trained model: gradient noise scale, curvature, sharpness, landscapes.

Each measurement takes a model and data, returns a frozen dataclass, prints nothing and leaves the
model exactly as it found it. `take_measurements` runs the ones a RunConfig names after training.
"""
from __future__ import annotations

import traceback
from typing import Any, Callable

import torch
import torch.nn as nn

from ..config import RunConfig
from ..data import Dataset

# name -> function(model, data, cfg, generator) -> dict of JSON-able numbers, merged into metrics.json.
# The names must equal config.MEASUREMENTS (a test checks).
MEASUREMENTS: dict[str, Callable[[nn.Module, Dataset, RunConfig, torch.Generator], dict[str, Any]]] = {}


def take_measurements(names: tuple[str, ...], model: nn.Module, data: Dataset, cfg: RunConfig,
                      generator: torch.Generator) -> dict[str, Any]:
    """Run the named measurements; one that fails is recorded under 'measurement_errors', not raised,
    so a finished training run is never lost to a measurement."""
    out: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            out.update(MEASUREMENTS[name](model, data, cfg, generator))
        except Exception:  # noqa: BLE001
            errors[name] = traceback.format_exc(limit=3)
    if errors:
        out["measurement_errors"] = errors
    return out
