"""Fused runs: many runs of one shape trained at once (stacked parameters, one batched step)."""
from .compat import fusion_blocker, unsupported_reason
from .trainer import train_group

__all__ = ["fusion_blocker", "train_group", "unsupported_reason"]
