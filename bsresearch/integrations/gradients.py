"""Each micro-batch's gradient as the trainer's own backward computes it, read by hooks on the parameters: no
copy of .grad, no extra pass, and nothing written (every hook returns None, so the gradient a parameter
accumulates is the one it would accumulate without them).

A tensor hook on a parameter receives the gradient its backward adds to .grad (`h`, the micro-batch's share of
the accumulated gradient, scaled as the trainer scaled the loss), before it is added. So over one optimizer
update, with G the accumulated gradient:

    |h_i|^2     summed over the parameters: micro-batch i's squared norm (one dot product per parameter)
    |G|^2       read at the end of the update's last backward, when .grad holds every micro-batch and the
                trainer has not yet clipped it (the Hugging Face Trainer clips before its callbacks see the
                gradient): one fused norm over the parameters' .grad, from a callback queued on autograd's
                engine by the backward's first hook. Where the trainer says which micro-batch ends the update
                (`begin_micro_batch(last=...)`), only that backward reads it; else every backward does, and the
                last one read counts

kept on the parameters' device and added up in float64 when the step's row is read: no sync before then. A hook
that runs after that callback (a backward inside the backward: reentrant gradient checkpointing) queues it
again, so |G|^2 is always read after the last gradient of the backward was added.
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

WIDE = (torch.float32, torch.float64)   # gradients of other dtypes are read in float32


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
        # per micro-batch, the hooks' |h|^2 (0-d tensors, summed only when the update's row is read)
        self.micro: list[list[torch.Tensor]] = []
        self.current: list[torch.Tensor] = []   # the micro-batch's own list in `micro`
        self.total: torch.Tensor | None = None   # |G|^2 at the end of the latest backward that read it
        self.read_total = True                   # whether this micro-batch's backward reads |G|^2
        self.to_queue = True                     # read_total, and no end-of-backward callback is waiting
        self.handles: list[RemovableHandle] = [p.register_hook(self._hook(p.dtype in WIDE)) for p in self.params]

    def _hook(self, wide: bool):  # noqa: ANN202 (a closure over the parameter's dtype)
        dot = torch.dot

        def hook(h: torch.Tensor) -> None:   # runs once per parameter and backward: kept to a few operations
            if self.paused:
                return
            if not self.micro:   # a backward with no micro-batch begun (a plain loop that forgot): count it as one
                self.begin_micro_batch()
            if self.to_queue:
                self.to_queue = False
                torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            flat = h.detach().reshape(-1) if wide else h.detach().reshape(-1).float()
            self.current.append(dot(flat, flat))
        return hook

    def _backward_done(self) -> None:
        """At the end of a backward (autograd's engine calls it): |.grad|^2 over the parameters, unclipped."""
        self.to_queue = self.read_total
        grads = [p.grad for p in self.params if p.grad is not None]
        wide = [g for g in grads if g.dtype in WIDE]
        narrow = [g for g in grads if g.dtype not in WIDE]
        norms = [*(torch._foreach_norm(wide) if wide else ()),
                 *(torch._foreach_norm(narrow, 2, dtype=torch.float32) if narrow else ())]
        if norms:
            self.total = torch.stack(norms).double().square().sum()

    def begin_micro_batch(self, last: bool | None = None) -> None:
        """A micro-batch begins; `last`: whether its backward ends the update (None: not known)."""
        self.current = []
        self.micro.append(self.current)
        self.read_total = self.to_queue = last is not False
        if self.read_total:
            self.total = None   # a total read before this backward is not the update's

    def take(self) -> tuple[list[float], float]:
        """(each micro-batch's |h_i|^2, the accumulated |G|^2 = |sum h_i|^2) of this update, as the trainer
        scaled them, summed in float64; then the next update starts empty. One sync. |G|^2 is NaN where the
        update's last backward did not read it (a micro-batch said not to be the last was)."""
        zero = torch.zeros((), device=self.device, dtype=torch.float64)
        sums = [torch.stack(m).double().sum() if m else zero for m in self.micro]
        if not self.micro or not any(self.micro):
            total = zero
        elif self.total is None:
            total = torch.full((), float("nan"), device=self.device, dtype=torch.float64)
        else:
            total = self.total
        values = torch.stack([*sums, total]).tolist()
        self.discard()
        return values[:-1], values[-1]

    def discard(self) -> None:
        """Forget the update so far (a step skipped by the trainer)."""
        self.micro, self.current, self.total = [], [], None
        self.read_total = self.to_queue = True

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
