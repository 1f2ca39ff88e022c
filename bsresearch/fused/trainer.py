"""Fused training: K runs of one shape trained as one batched program (work in progress)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config import RunConfig
from ..train import RunResult


def train_group(cfgs: Sequence[RunConfig], run_dirs: Sequence[str | Path | None] | None = None,
                progress: bool | None = None, group_id: str | None = None) -> list[RunResult]:
    """Train every config in `cfgs` together; per member the same result as `train.run(cfg, run_dir)`."""
    raise NotImplementedError("train_group is being written on branch fused-core")
