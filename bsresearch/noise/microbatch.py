"""The noise scale for free inside a training step of bsresearch's loop: the first micro-batch's gradient is a
small batch and the accumulated step's gradient the big one, at the same weights (no extra forward or backward
pass, no drift between the two). micro_batch_hooks reads the two squared norms; MicroBatchNoise is the loop's
callback that feeds each member's NoiseMeter from them and owns its history columns and checkpointed state.
"""
from __future__ import annotations

from typing import Any

import torch

from ..config import RunConfig
from ..loop import Callback, Loop, Member, Order, StepHooks
from ..state import TrainState
from ..step import Size, share_of
from .estimators import NoiseScaleEMA, noise_ema_columns, squared_grad_norm
from .meter import NoiseMeter


def micro_batch_hooks(cfg: RunConfig, state: TrainState, meter: NoiseMeter) -> StepHooks | None:
    """The hooks that feed `meter` at this step (every cfg.noise_scale_every steps; else None): |G_small|^2 of
    the first micro-batch alone and |G_big|^2 of the whole batch, at the same parameters, in examples.

    The first micro-batch's gradient is divided by the weight the step gave it (step.share_of: its examples'
    share of the batch, or for a token-level loss its real tokens' share), which gives its own mean-loss
    gradient. Its size is b_big times that share: its examples, or for a token-level loss its real tokens in
    units of the batch's mean tokens per example (sequences of unequal real length: one with padding weighs
    less), so that the pair's two sizes are those of the two means."""
    if not cfg.noise_scale_every or state.step % cfg.noise_scale_every:
        return None
    b_big = state.indices.size_at(state.step)
    small: list[tuple[torch.Tensor, float]] = []   # |g_small|^2 of the first micro-batch's own mean, its size

    def after_backward(i: int, n_micro: Size, n_batch: Size) -> None:
        if i == 0:  # undo the micro-batch weight: the small batch's own mean-loss gradient
            share = share_of(n_micro, n_batch)
            size = n_micro if isinstance(n_micro, int) and isinstance(n_batch, int) else share * b_big
            small.append((squared_grad_norm(state.model) / share ** 2, size))

    def before_update() -> None:
        grad_scale_sq = state.scaler.get_scale() ** 2 if state.scaler else 1.0   # .grad holds scaled gradients
        (sq_norm, b_small), = small
        meter.pair(float(sq_norm) / grad_scale_sq, float(squared_grad_norm(state.model)) / grad_scale_sq,
                   b_small, b_big, estimator="micro_batch", step=state.step)
    return StepHooks(after_backward, before_update)


class MicroBatchNoise(Callback):
    """Every cfg.noise_scale_every steps, the two-batch noise scale of the step's micro-batches
    (micro_batch_hooks) feeds the member's NoiseMeter, of decay cfg.noise_scale_ema. Owns every member's
    meter (its EMA checkpointed under `key`) and its history columns (estimators.noise_ema_columns)."""
    key = "noise_scale"
    order = Order.MEASURE

    def __init__(self) -> None:
        self.meters: dict[int, NoiseMeter] = {}   # member index -> its meter (none before its first sample)

    def of(self, member: Member) -> NoiseScaleEMA | None:
        """`member`'s EMA now (None before its first sample)."""
        meter = self.meters.get(member.index)
        return meter.ema if meter else None

    def step_hooks(self, loop: Loop, member: Member) -> StepHooks | None:
        if not member.cfg.noise_scale_every or member.state.step % member.cfg.noise_scale_every:
            return None
        meter = self.meters.setdefault(member.index, NoiseMeter(member.cfg.noise_scale_ema))
        return micro_batch_hooks(member.cfg, member.state, meter)

    def columns(self, loop: Loop, member: Member) -> dict[str, Any]:
        return noise_ema_columns(self.of(member)) if member.cfg.noise_scale_every else {}

    def state_dict(self, member: Member) -> dict[str, Any] | None:
        meter = self.meters.get(member.index)
        return meter.state_dict() if meter else None

    def load_state_dict(self, member: Member, state: dict[str, Any]) -> None:
        meter = self.meters.setdefault(member.index, NoiseMeter(float(state["decay"])))
        meter.load_state_dict(state)
