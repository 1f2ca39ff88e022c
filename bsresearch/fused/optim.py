"""One optimizer update for all members at once, on the flat (K, P) parameters, following torch.optim.

Per-member hyperparameters are (K, 1) columns, so one set of element-wise operations updates every
member. The rules are torch.optim's (single-tensor implementations, maximize=False, dampening 0):
  SGD:   d = g + wd*p;  buf = momentum*buf + d (buf = d at the first step);
         d = d + momentum*buf (nesterov) or buf;  p -= lr*d
  Adam:  g = g + wd*p;  m = lerp(m, g, 1-beta1);  v = beta2*v + (1-beta2)*g*g;
         p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
  AdamW: p *= 1 - lr*wd, then Adam without the gradient's weight decay.
The buffers start at zero, which reproduces torch's first step exactly (momentum*0 + d = d).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import schedule
from ..config import RunConfig

ADAM_BETA1 = 0.9  # torch.optim's default, as step.make_optimizer uses it; beta2 is per member
ADAM_EPS = 1e-8


@dataclass
class FusedOptimizer:
    """Optimizer state of K members: hyperparameter columns (K, 1) and buffers (K, P)."""
    kind: str                      # sgd | adam | adamw
    weight_decay: torch.Tensor     # (K, 1)
    momentum: torch.Tensor         # (K, 1), SGD
    nesterov: torch.Tensor         # (K, 1) bool, SGD
    beta2: torch.Tensor            # (K, 1), Adam (schedule.adam_beta2_at the member's batch size)
    buf: torch.Tensor              # SGD momentum buffer / Adam first moment, (K, P)
    sq: torch.Tensor | None        # Adam second moment, (K, P)
    step: int = 0                  # updates done (members move in lockstep)
    any_weight_decay: bool = True  # host-side flags: skip work no member needs, without a device sync
    any_nesterov: bool = True
    one_beta2: float | None = None  # every member's beta2, when they share one (torch's arithmetic exactly)

    def __post_init__(self) -> None:
        self._flags()

    def _flags(self) -> None:
        self.any_weight_decay = bool(self.weight_decay.any())
        self.any_nesterov = bool(self.nesterov.any())
        values = set(self.beta2.flatten().tolist())
        self.one_beta2 = values.pop() if len(values) == 1 else None

    @classmethod
    def for_members(cls, cfgs: Sequence[RunConfig], flat: torch.Tensor) -> FusedOptimizer:
        kinds = {c.optimizer for c in cfgs}
        if len(kinds) != 1:
            raise ValueError(f"one optimizer per fused group, got {sorted(kinds)}")
        kind = kinds.pop()

        def column(values: list[float], dtype: torch.dtype = flat.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=flat.device).view(-1, 1)
        return cls(kind, column([c.weight_decay for c in cfgs]), column([c.momentum for c in cfgs]),
                   column([c.nesterov for c in cfgs], torch.bool),
                   column([schedule.adam_beta2_at(c, c.batch_size) for c in cfgs], torch.float64),
                   torch.zeros_like(flat),
                   torch.zeros_like(flat) if kind != "sgd" else None)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only the members at `index` (compaction after some members stopped)."""
        self.weight_decay, self.momentum, self.nesterov, self.beta2 = (
            self.weight_decay[index], self.momentum[index], self.nesterov[index], self.beta2[index])
        self.buf = self.buf[index]
        self.sq = self.sq[index] if self.sq is not None else None
        self._flags()

    @torch.no_grad()
    def update(self, p: torch.Tensor, g: torch.Tensor, lr: torch.Tensor) -> None:
        """One update of p (K, P) in place from its gradient g (K, P) with learning rates lr (K, 1).

        g is used as scratch space (it is the step's gradient, not needed afterwards). Every operation is
        in place over (K, P): on the CPU a fresh (K, P) temporary costs more than the arithmetic.
        """
        self.step += 1
        if self.kind == "sgd":
            if self.any_weight_decay:
                g.addcmul_(self.weight_decay, p)                   # d = g + wd*p
            self.buf.mul_(self.momentum).add_(g)                   # buf = momentum*buf + d
            if self.any_nesterov:
                # nesterov: d + momentum*buf; otherwise buf = 0*d + 1*buf (exact)
                g.mul_(self.nesterov).addcmul_(self.buf, torch.where(self.nesterov, self.momentum, 1.0))
                update = g
            else:
                update = self.buf
            p.addcmul_(update, -lr)                                # p -= lr*d
            return
        assert self.sq is not None
        if self.kind == "adamw":
            p.mul_(1 - lr * self.weight_decay)
        elif self.any_weight_decay:
            g.addcmul_(self.weight_decay, p)
        self.buf.lerp_(g, 1 - ADAM_BETA1)
        correction: float | torch.Tensor
        if self.one_beta2 is not None:
            b2 = self.one_beta2
            self.sq.mul_(b2).addcmul_(g, g, value=1 - b2)          # torch's own operations
            correction = math.sqrt(1 - b2 ** self.step)
        else:   # per-member beta2: the same roundings (1 - beta2 and the bias correction in float64, as torch's
            b2t = self.beta2.to(p.dtype)                            # Python floats are, then cast)
            self.sq.mul_(b2t).addcmul_(g * (1 - self.beta2).to(p.dtype), g)
            correction = (1 - self.beta2 ** self.step).sqrt().to(p.dtype)
        step_size = lr / (1 - ADAM_BETA1 ** self.step)
        denom = torch.sqrt(self.sq, out=g).div_(correction).add_(ADAM_EPS)
        p.addcmul_(torch.div(self.buf, denom, out=denom), -step_size)  # torch: p.addcdiv_(m, denom, value=-step_size)

    def torch_state(self, member: int) -> tuple[str, torch.Tensor | None, torch.Tensor | None]:
        """(kind, first buffer row, second buffer row) of one member, in the flat layout."""
        return (self.kind, self.buf[member:member + 1],
                self.sq[member:member + 1] if self.sq is not None else None)
