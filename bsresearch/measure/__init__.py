"""Pure measurements of a trained model: gradient noise scale, curvature, sharpness, landscapes.

Each measurement takes a model and data, returns a frozen dataclass, prints nothing and leaves the
model exactly as it found it (parameters, buffers, train/eval mode; the global RNGs are never used).
`take_measurements` runs the ones a RunConfig names after training; `MEASUREMENTS` is that registry.

Modules: noise (B_simple exact and two-batch, EMA, bootstrap, B_noise), critical (B_crit fits, no torch),
curvature (HVPs, Lanczos/power eigenvalues, Hutchinson trace, spectral density, per layer), lanczos (the
linear algebra), sharpness (Keskar, worst/average-case, adaptive, m-sharpness), landscape (interpolation,
filter-normalised slices), functional (shared plumbing), registry (the MEASUREMENTS entries).

This file imports nothing heavy, so `bsresearch.measure.critical` stays torch-free for analysis code.
"""
from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("MEASUREMENTS", "take_measurements"):
        from . import registry
        return getattr(registry, name)
    raise AttributeError(f"module 'bsresearch.measure' has no attribute {name!r}")


__all__ = ["MEASUREMENTS", "take_measurements"]
