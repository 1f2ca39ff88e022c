"""Fused runs of any model torch.func can batch: K members' parameters stacked, one vmapped program.

The built-in mlp and cnn1d have their own batched layers (fused/layers.py). Any other model, a user's
included, fuses here when torch.func.vmap can take it: its parameters become (K, ...) tensors, views of one
flat (K, P) tensor, so fused/optim.py updates all members in one set of operations; gradients accumulate
into one flat (K, P) buffer (each parameter's .grad is a view of it, filled in place by autograd); the
forward pass and the loss are vmapped over the members, each on its own batch; a model's
scaled_dot_product_attention runs there as one call for all members (fused/attention.py).

What cannot fuse, and is said in one line before any training (`probe`): BatchNorm (its running statistics
are updated in place in training), random draws in training (dropout: vmap cannot give each member its own
stream, so a fused member would not be the run it stands for), and anything else vmap refuses (a
data-dependent `.item()`, an operation without a batching rule).

Fusing a small model pays (the per-step overhead is paid once for K members); a model whose one-member
step already keeps the processor busy gains nothing, or loses. `calibrate` times a few fused steps against
the same steps one member after another, on copies, before a group trains; train_group then fuses only
where it pays.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.func import vmap

from ..batch import Inputs, call, logits_of
from ..data import Dataset, eval_chunk_size
from ..engine import EvalSums
from ..loop import Member
from ..losses import Loss, Task
from ..runtime import synchronize
from .attention import batched_attention
from .engine import FusedEngine

# The parameters' .grad are views of one flat buffer, which is the point; autograd warns that such a grad does
# not follow its "layout contract" (the performance it means is not lost here: the views are dense rows).
LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"
CALIBRATION_STEPS = 5     # timed rounds (fused, then each member alone) after one untimed call of each
PAYS = 1.05               # fuse only when the fused step is at least this much faster per member
EVAL_MEMBERS = 8          # members per evaluation forward pass


def _members(x: Inputs, k: int) -> Inputs:
    """The same inputs for k members (a tensor, or each of named tensors, expanded along a new first dim)."""
    return pytree.tree_map(lambda t: t.expand(k, *t.shape), x)


def probe(model: nn.Module, x: Inputs, y: torch.Tensor, loss: Loss) -> str | None:
    """Why vmap over stacked parameters cannot train `model` (one line), or None. Tries two members on the
    two examples (x, y): forward, loss and backward, in train mode, random draws forbidden."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules()):
        return "BatchNorm's running statistics are updated in place in training, which vmap cannot batch"
    stack = _Stack([model, model], x.device)
    try:
        with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []), batched_attention():
            value = vmap(stack.loss_fn(model, loss), randomness="error")(stack.leaves, _members(x, 2),
                                                                          _members(y, 2))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=LAYOUT_WARNING)
                value.sum().backward()
    except RuntimeError as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "randomness" in text:
            return "the model draws random numbers in training (dropout): vmap cannot give each member its own stream"
        return f"torch.func.vmap cannot batch the model ({type(exc).__name__}: {text[:160]})"
    except Exception as exc:  # noqa: BLE001 - whatever vmap refuses is a reason not to fuse, not a failure
        return f"torch.func.vmap cannot batch the model ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
    finally:
        model.zero_grad(set_to_none=True)
    return None


class _Stack:
    """K models' parameters as views of one flat (K, P) tensor, and their gradients as views of one flat
    (K, P) buffer, in named_parameters order (torch's own layout)."""

    def __init__(self, models: list[nn.Module], device: torch.device):
        template = models[0]
        self.names = [name for name, _ in template.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in template.named_parameters()]
        self.flat = torch.stack([torch.cat([p.detach().reshape(-1) for p in m.parameters()]) for m in models]
                                ).to(device)
        self.buffers = dict(template.named_buffers())   # constant buffers (a causal mask): shared by every member
        self.rebuild()

    def rebuild(self) -> None:
        """Leaves (views of flat, requiring grad) whose .grad are views of one zeroed flat buffer."""
        k = len(self.flat)
        self.grad = torch.zeros_like(self.flat)
        self.leaves: dict[str, torch.Tensor] = {}
        offset = 0
        for name, shape in zip(self.names, self.shapes):
            n = int(torch.Size(shape).numel())
            leaf = self.flat[:, offset:offset + n].view(k, *shape).requires_grad_(True)
            leaf.grad = self.grad[:, offset:offset + n].view(k, *shape)
            self.leaves[name] = leaf
            offset += n

    def loss_fn(self, model: nn.Module, loss: Loss) -> Callable[..., torch.Tensor]:
        buffers = self.buffers

        def one(params: dict[str, torch.Tensor], x: Inputs, y: torch.Tensor) -> torch.Tensor:
            return loss.of(model, x, y, {**params, **buffers})
        return one

    def rows(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """The members at `rows`, detached (evaluation)."""
        index = torch.tensor(rows, device=self.flat.device)
        return {name: leaf.detach()[index] for name, leaf in self.leaves.items()}


class VmapEngine(FusedEngine):
    """The loop's engine for a fused group of any model `probe` accepts (module docstring): the members'
    parameters as views of one flat (K, P) tensor, their loss vmapped over the members; what every fused
    engine does alike is fused/engine.py's FusedEngine."""

    def __init__(self, members: list[Member], data: Dataset, loss: Loss, task: Task, device: torch.device):
        super().__init__(members, data)
        self.loss, self.task = loss, task
        self.model = members[0].state.model
        self.stack = _Stack([m.state.model for m in members], device)
        self._start(self.stack.flat)
        self.one = self.stack.loss_fn(self.model, loss)
        if task.token_level:   # micro-batches weighted by each member's real tokens (step.micro_batch_loss)
            self.count = lambda micro: torch.stack([task.count(data.y_train[row]) for row in micro])

    def _parameters(self) -> torch.Tensor:
        return self.stack.flat

    def _zero_grad(self) -> None:
        self.stack.grad.zero_()

    def _gradient(self) -> torch.Tensor:
        return self.stack.grad

    def _losses(self, lo: int, n: int, micro: torch.Tensor) -> torch.Tensor:
        """All members in one pass (lo 0, n all): the vmapped loss, each member on its own batch."""
        with batched_attention():
            return vmap(self.one, randomness="error")(self.stack.leaves, self.data.x_train[micro],
                                                      self.data.y_train[micro])

    def _backward(self, loss: torch.Tensor) -> None:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LAYOUT_WARNING)
            loss.backward()

    def _keep(self, index: torch.Tensor) -> None:
        self.stack.flat = self.stack.flat[index]
        self.stack.rebuild()

    @torch.no_grad()
    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        x, y = (self.data.x_train, self.data.y_train) if split == "train" else (self.data.x_test, self.data.y_test)
        x, y = x[:limit], y[:limit]
        rows = self._rows(members)
        chunk = eval_chunk_size(self.task.tokens_per_example)
        buffers, model, loss = self.stack.buffers, self.model, self.loss

        def forward(p: dict[str, torch.Tensor], xs: Inputs, ys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            output = call(model, xs, ys if loss.from_model else None, {**p, **buffers})
            logits = logits_of(output)   # (and the model's own loss, which is all `loss: model` reads)
            return logits, (loss(output, ys) if loss.from_model else logits.new_zeros(()))
        out: list[tuple[float, float | None]] = []
        for lo in range(0, len(rows), EVAL_MEMBERS):
            params = self.stack.rows(rows[lo:lo + EVAL_MEMBERS])
            k = len(rows[lo:lo + EVAL_MEMBERS])
            sums = [EvalSums(loss, self.task.accuracy, self.task) for _ in range(k)]
            for start in range(0, len(x), chunk):
                xb, yb = x[start:start + chunk], y[start:start + chunk]
                with batched_attention():
                    logits, own = vmap(forward, in_dims=(0, None, None))(params, xb, yb)
                for i in range(k):
                    sums[i].add({"logits": logits[i], "loss": own[i]} if loss.from_model else logits[i], yb)
            out += [s.result() for s in sums]
        return out

    @torch.no_grad()
    def _unstack(self, member: Member, row: int) -> None:
        """Row `row`'s weights into the member's model, parameter by parameter, with its optimizer state."""
        opt = self.optimizer
        params = dict(member.state.model.named_parameters())
        moments = []
        offset = 0
        for name, shape in zip(self.stack.names, self.stack.shapes):
            n = int(torch.Size(shape).numel())
            p = params[name]
            p.copy_(self.stack.flat[row, offset:offset + n].view(shape))
            moments.append((p, opt.buf[row, offset:offset + n].view(shape),
                            opt.sq[row, offset:offset + n].view(shape) if opt.sq is not None else None))
            offset += n
        self._write_optimizer(member, moments)


def _seconds(step: Callable[[], object], device: torch.device, clock: Callable[[], float]) -> float:
    """Seconds of one call of `step` on `clock`, the device's queued work included."""
    synchronize(device)
    start = clock()
    step()
    synchronize(device)
    return clock() - start


def calibrate(fused: Callable[[], object], alone: list[Callable[[], object]], device: torch.device,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """How many times faster per member a fused step is than the members' steps one after another (the
    steps given run on copies of the members, so the group's training is untouched).

    After one untimed call of each, CALIBRATION_STEPS rounds alternate one fused step with one step of every
    member alone, and each side counts its fastest round: a machine whose load changes during the
    calibration (another worker's run starting or ending) then slows both sides' slow rounds alike, where
    timing one side after the other would charge the load to whichever side it fell on. `clock` reads seconds
    (time.perf_counter; a test passes a fake one that its steps advance)."""
    fused()
    for step in alone:
        step()
    fused_rounds, alone_rounds = [], []
    for _ in range(CALIBRATION_STEPS):
        fused_rounds.append(_seconds(fused, device, clock))
        alone_rounds.append(sum(_seconds(step, device, clock) for step in alone))
    return min(alone_rounds) / max(min(fused_rounds), 1e-12)
