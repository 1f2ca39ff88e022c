"""Each micro-batch's gradient as the trainer's own backward computes it, read by hooks on the parameters: no
copy of .grad, no extra pass, and nothing written (every hook returns None, so the gradient a parameter
accumulates is the one it would accumulate without them).

A tensor hook on a parameter receives the gradient its backward adds to .grad (`h`, the micro-batch's share of
the accumulated gradient, scaled as the trainer scaled the loss), before it is added: .grad then holds the
previous micro-batches' sum `A`. So over one optimizer update

    |h_i|^2                      summed over the parameters: micro-batch i's squared norm
    |A + h|^2 = |A|^2 + 2 h.A + |h|^2   the accumulated gradient's squared norm, kept current

which equals `.grad` after minus before the micro-batch's backward, and |.grad|^2 before the trainer clips it
(the Hugging Face Trainer clips before its callbacks see the gradient). Two dot products per parameter and
micro-batch, added up in float64 on the parameters' device (no sync until the step's row is read).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle


def _wide(t: torch.Tensor) -> torch.Tensor:
    """A gradient flat, in float32 at least (float64 stays float64); the sums are kept in float64."""
    flat = t.detach().reshape(-1)
    return flat if flat.dtype in (torch.float32, torch.float64) else flat.float()


class GradientWatch:
    """Squared norms of each micro-batch's gradient and of the accumulated gradient, from the parameters'
    hooks. `begin_micro_batch()` starts a micro-batch (before its backward); `take()` returns the update's
    norms and starts a new update. Paused (`paused = True`) while bsresearch runs its own passes."""

    def __init__(self, model: nn.Module) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.device = self.params[0].device
        self.paused = False
        self.micro: list[torch.Tensor] = []      # |h_i|^2 of each micro-batch of this update
        self.total = torch.zeros((), device=self.device, dtype=torch.float64)   # |sum of h|^2 so far this update
        self.handles: list[RemovableHandle] = [p.register_hook(self._hook(p)) for p in self.params]

    def _hook(self, p: torch.Tensor):  # noqa: ANN202 (a closure over p)
        def hook(h: torch.Tensor) -> None:
            if self.paused:
                return
            if not self.micro:   # a backward with no micro-batch begun (a plain loop that forgot): count it as one
                self.begin_micro_batch()
            flat = _wide(h)
            sq = torch.dot(flat, flat)
            self.micro[-1] += sq
            grad = p.grad
            self.total += sq if grad is None else sq + 2 * torch.dot(flat, _wide(grad))
        return hook

    def begin_micro_batch(self) -> None:
        self.micro.append(torch.zeros((), device=self.device, dtype=torch.float64))

    def take(self) -> tuple[list[float], float]:
        """(each micro-batch's |h_i|^2, the accumulated |sum h_i|^2) of this update, as the trainer scaled
        them; then the next update starts empty. One device sync."""
        values = torch.stack([*self.micro, self.total]).tolist() if self.micro else [float(self.total)]
        self.micro, self.total = [], torch.zeros((), device=self.device, dtype=torch.float64)
        return values[:-1], values[-1]

    def discard(self) -> None:
        """Forget the update so far (a step skipped by the trainer)."""
        self.micro, self.total = [], torch.zeros((), device=self.device, dtype=torch.float64)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
