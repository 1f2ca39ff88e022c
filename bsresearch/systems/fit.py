"""The linear memory model: peak bytes = fixed + per_example x batch_size, and what it predicts.

Fixed: parameters, gradients, optimizer state, workspaces. Per example: the input and the activations
saved for backward. The fit is least squares over measured batch sizes; its residual says how linear
the measurements were (on CUDA the allocator rounds block sizes, so expect small residuals).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..config import ConfigError

if TYPE_CHECKING:
    import pandas as pd  # only a type here; a fused group's process (fused/memory.py) need not load it


@dataclass(frozen=True)
class MemoryFit:
    """peak_bytes ~= fixed_bytes + per_example_bytes x batch_size, fitted by least squares."""
    fixed_bytes: float
    per_example_bytes: float
    rms_residual_bytes: float      # root-mean-square residual over the measured sizes
    max_residual_bytes: float      # largest |measured - predicted|
    batch_sizes: tuple[int, ...]   # the sizes the fit was made from

    def predict(self, batch_size: float) -> float:
        """Predicted peak bytes at batch_size."""
        return self.fixed_bytes + self.per_example_bytes * batch_size

    def largest_batch(self, memory_budget: float, safety_margin: float = 0.0) -> int:
        """Largest batch size whose predicted peak, plus the largest residual seen, fits in
        memory_budget x (1 - safety_margin) bytes; 0 if not even one example fits."""
        if self.per_example_bytes <= 0:
            raise ValueError(f"the fitted memory does not grow with the batch size (per example "
                             f"{self.per_example_bytes:.3g} bytes); no largest batch can be predicted")
        usable = memory_budget * (1.0 - safety_margin) - self.max_residual_bytes
        # + 1e-6: a budget that is exactly the prediction at B must give B despite rounding in the fit
        return max(0, math.floor((usable - self.fixed_bytes) / self.per_example_bytes + 1e-6))


def fit_memory(batch_sizes: Sequence[int], peak_bytes: Sequence[float]) -> MemoryFit:
    """Least-squares fit of peak_bytes against batch_sizes (at least two distinct sizes)."""
    b = np.asarray(batch_sizes, dtype=float)
    m = np.asarray(peak_bytes, dtype=float)
    if len(b) != len(m):
        raise ValueError(f"{len(b)} batch sizes but {len(m)} memory values")
    if len(set(b.tolist())) < 2:
        raise ConfigError(f"a memory fit needs at least two distinct batch sizes; got {sorted(set(b.tolist()))}")
    design = np.stack([np.ones_like(b), b], axis=1)
    (fixed, per_example), *_ = np.linalg.lstsq(design, m, rcond=None)
    residual = m - design @ np.array([fixed, per_example])
    return MemoryFit(fixed_bytes=float(fixed), per_example_bytes=float(per_example),
                     rms_residual_bytes=float(np.sqrt(np.mean(residual ** 2))),
                     max_residual_bytes=float(np.max(np.abs(residual))),
                     batch_sizes=tuple(int(v) for v in b))


def fit_memory_table(table: pd.DataFrame, column: str = "peak_bytes") -> MemoryFit:
    """Fit the rows of a `measure_memory` table whose status is 'ok'."""
    ok = table[table["status"] == "ok"] if "status" in table else table
    return fit_memory(ok["batch_size"].tolist(), ok[column].tolist())
