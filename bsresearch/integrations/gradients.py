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
micro-batch, kept on the parameters' device and added up (in float64) when the step's row is read: no sync
before then.
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
        # per micro-batch, the hooks' dot products (0-d tensors, summed only when the update's row is read)
        self.micro: list[list[torch.Tensor]] = []     # |h|^2 of each parameter
        self.cross: list[torch.Tensor] = []           # h.A of each parameter and micro-batch
        self.handles: list[RemovableHandle] = [p.register_hook(self._hook(p)) for p in self.params]

    def _hook(self, p: torch.Tensor):  # noqa: ANN202 (a closure over p)
        def hook(h: torch.Tensor) -> None:
            if self.paused:
                return
            if not self.micro:   # a backward with no micro-batch begun (a plain loop that forgot): count it as one
                self.begin_micro_batch()
            flat = _wide(h)
            self.micro[-1].append(torch.dot(flat, flat))
            grad = p.grad
            if grad is not None:
                self.cross.append(torch.dot(flat, _wide(grad)))
        return hook

    def begin_micro_batch(self) -> None:
        self.micro.append([])

    def take(self) -> tuple[list[float], float]:
        """(each micro-batch's |h_i|^2, the accumulated |sum h_i|^2 = sum |h_i|^2 + 2 sum h_i.A_i) of this
        update, as the trainer scaled them, summed in float64; then the next update starts empty. One sync."""
        zero = torch.zeros((), device=self.device, dtype=torch.float64)
        sums = [torch.stack(m).double().sum() if m else zero for m in self.micro]
        cross = torch.stack(self.cross).double().sum() if self.cross else zero
        values = torch.stack([*sums, cross]).tolist()
        self.discard()
        micro, cross_value = values[:-1], values[-1]
        return micro, sum(micro) + 2 * cross_value

    def discard(self) -> None:
        """Forget the update so far (a step skipped by the trainer)."""
        self.micro, self.cross = [], []

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
