"""The loop's engines for a fused group: what they share, `FusedEngine`, and the two, `StackEngine` and
`VmapEngine`.

A fused engine holds K members' trainable state as one flat (K, P) parameter tensor, in the order of
`self.members`, with one FusedOptimizer (fused/optim.py) for all. `FusedEngine` is everything the two engines
do alike: a step's scaffolding (each member's next batch indices, the micro-batches, the members per
forward/backward pass, the accumulation rule of step.micro_batch_loss, the batch losses, one optimizer update
with every member's own lr, the step and examples bookkeeping), the weight statistics, and a member leaving
(its row written back into its own TrainState: weights, optimizer state and lr, then dropped).

The two engines differ in the forward program and in what follows from it (where the parameters live, the
BatchNorm buffers, evaluation):
- `StackEngine`: the built-in mlp and cnn1d through the batched layers of fused/layers.py, BatchNorm
  running statistics included; on a CPU the forward/backward passes go over slices of the members.
- `VmapEngine`: any model torch.func.vmap can batch (fused/generic.py's probe says which), through
  functional_call, its parameters views of one flat tensor (`ParameterStack`).
"""
from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import vmap

from .. import schedule
from ..data import Dataset, eval_chunk_size
from ..engine import CROSS_ENTROPY, EvalSums, evaluate_batches
from ..loop import Member, StepHooks
from ..losses import Loss, Task
from ..model_io import Inputs, call, logits_of
from ..step import micro_batch_loss
from .attention import batched_attention
from .layers import StackedModel
from .optim import FusedOptimizer

CPU_PASS_EXAMPLES = 1024  # members x examples per training forward/backward pass on the CPU (cache-sized)
EVAL_MEMBERS = 8          # members per evaluation forward pass of VmapEngine
# The parameters' .grad are views of one flat buffer, which is the point; autograd warns that such a grad does
# not follow its "layout contract" (the performance it means is not lost here: the views are dense rows).
LAYOUT_WARNING = "grad and param do not obey the gradient layout contract"


class FusedEngine(ABC):
    """What the fused engines share (module docstring). A subclass sets up its parameters, then calls
    `_start(flat)`, and gives the forward program (`_losses`) and the storage of the parameters (the abstract
    methods below)."""
    can_split = True

    def __init__(self, members: Sequence[Member], data: Dataset) -> None:
        self.members = list(members)
        self.data = data
        self.micro_batch_size = members[0].cfg.micro_batch_size
        # a token-level loss: each member's real tokens in a micro-batch (its rows of training indices), by which
        # micro-batches are weighted instead of examples (step.micro_batch_loss); None weighs examples
        self.count: Callable[[torch.Tensor], torch.Tensor] | None = None

    def _start(self, flat: torch.Tensor) -> None:
        """The initial weights (K, P) kept for the distance from them, and the optimizer over `flat`."""
        self.initial = flat.clone()
        self.optimizer = FusedOptimizer.for_members([m.cfg for m in self.members], flat)

    # --- what a subclass gives
    @abstractmethod
    def _parameters(self) -> torch.Tensor:
        """The members' parameters now, (K, P), without autograd history."""

    @abstractmethod
    def _zero_grad(self) -> None:
        """Before a step's first backward pass: no gradient from the previous step."""

    @abstractmethod
    def _gradient(self) -> torch.Tensor:
        """After a step's backward passes: the accumulated gradient (K, P), the optimizer's scratch space."""

    def _members_per_pass(self, micro_batch_size: int, k: int) -> int:
        """How many members one forward/backward pass takes (all of them, unless a subclass says otherwise)."""
        return k

    @abstractmethod
    def _losses(self, lo: int, n: int, micro: torch.Tensor) -> torch.Tensor:
        """The mean losses (n,) of the members at rows lo..lo+n, each on its row of `micro` (n, b) (indices
        into the training set), in training mode, with autograd history: the forward program."""

    def _backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of `loss` (a 0-d sum of members' losses) into the members' gradient."""
        loss.backward()

    @abstractmethod
    def _keep(self, index: torch.Tensor) -> None:
        """Keep only the members at rows `index` in the parameters (and whatever else holds a row per member)."""

    @abstractmethod
    def _unstack(self, member: Member, row: int) -> None:
        """Write row `row` (weights, buffers, optimizer state) into the member's TrainState (_write_optimizer)."""

    # --- the loop's engine (loop.Engine)
    def _rows(self, members: list[Member]) -> list[int]:
        return [next(r for r, s in enumerate(self.members) if s is m) for m in members]

    def step(self, members: list[Member], lrs: list[float], hooks: list[StepHooks | None]) -> torch.Tensor:
        """One optimizer update of every member on its own next batch; the members' batch losses (K,).

        Micro-batches accumulate (step.micro_batch_loss); the forward/backward passes go over consecutive
        slices of the members where the subclass says so (_members_per_pass); the update is one for all.
        """
        k = len(members)
        idx = torch.stack([next(m.state.indices) for m in members])            # (K, B)
        micro_batches = idx.split(self.micro_batch_size, dim=1) if self.micro_batch_size else (idx,)
        per_pass = self._members_per_pass(micro_batches[0].shape[1], k)
        count = self.count if len(micro_batches) > 1 else None
        whole = count(idx) if count is not None else None   # each member's real tokens in its whole batch
        self._zero_grad()
        flat = self._parameters()
        total = torch.zeros(k, device=flat.device)
        for lo in range(0, k, per_pass):
            n = min(per_pass, k - lo)
            for micro in micro_batches:
                micro = micro[lo:lo + n]
                if count is not None and whole is not None:
                    loss = micro_batch_loss(self._losses(lo, n, micro), count(micro), whole[lo:lo + n])
                else:
                    loss = micro_batch_loss(self._losses(lo, n, micro), micro.shape[1], idx.shape[1])
                self._backward(loss.sum())
                total[lo:lo + n] += loss.detach()
        lr = torch.tensor(lrs, device=flat.device, dtype=flat.dtype).view(-1, 1)
        self.optimizer.update(self._parameters(), self._gradient(), lr)
        for m in members:
            m.state.step += 1
            m.state.examples_seen += idx.shape[1]
        return total

    @torch.no_grad()
    def weight_stats(self, members: list[Member]) -> list[tuple[float, float]]:
        """(L2 distance from the initial weights, L2 norm of the weights) of `members`."""
        flat = self._parameters()
        index = torch.tensor(self._rows(members), device=flat.device)
        flat = flat[index]
        distance = ((flat - self.initial[index]) ** 2).sum(1).sqrt()
        norm = (flat ** 2).sum(1).sqrt()
        return list(zip(distance.tolist(), norm.tolist()))

    def remove(self, members: list[Member]) -> None:
        """Write the members' rows back into their TrainState, then drop them from the stack."""
        rows = self._rows(members)
        for m, row in zip(members, rows):
            self._unstack(m, row)
        keep = [r for r in range(len(self.members)) if r not in set(rows)]
        index = torch.tensor(keep, dtype=torch.long, device=self.initial.device)
        self._keep(index)
        self.initial = self.initial[index]
        self.optimizer.keep(index)
        self.members = [self.members[r] for r in keep]

    @torch.no_grad()
    def _write_optimizer(self, member: Member,
                         moments: Iterable[tuple[nn.Parameter, torch.Tensor, torch.Tensor | None]]) -> None:
        """The member's torch optimizer state from its row of the fused optimizer: for each parameter, its
        first moment (SGD's momentum buffer, Adam's exp_avg) and second (Adam's exp_avg_sq, else None), each in
        the parameter's shape; and its param groups' lr at its last step, as a run alone leaves them."""
        state, cfg, opt = member.state, member.cfg, self.optimizer
        torch_opt = state.optimizer
        for p, first, second in moments:
            if opt.kind == "sgd":
                if cfg.momentum != 0 and opt.step > 0:
                    torch_opt.state[p] = {"momentum_buffer": first.clone()}
            elif opt.step > 0:
                assert second is not None
                torch_opt.state[p] = {"step": torch.tensor(float(opt.step)), "exp_avg": first.clone(),
                                      "exp_avg_sq": second.clone()}
        if state.step > 0:
            for group in torch_opt.param_groups:
                group["lr"] = schedule.lr_at(cfg, state.step - 1, state.sampler.n)


# ----------------------------------------------------------------------------- the built-in mlp and cnn1d
class StackEngine(FusedEngine):
    """The loop's engine for a fused group of the built-in mlp and cnn1d: the members' parameters as one flat
    (K, P) leaf through the batched layers (fused/layers.py), their BatchNorm buffers stacked beside it."""

    def __init__(self, members: list[Member], data: Dataset, device: torch.device):
        super().__init__(members, data)
        self.model = StackedModel(members[0].state.model, data.input_shape)
        flat, self.buffers = self.model.stack([m.state.model for m in members], device)
        self._start(flat)
        self.flat = flat.requires_grad_(True)

    def _parameters(self) -> torch.Tensor:
        return self.flat.detach()

    def _zero_grad(self) -> None:
        self.flat.grad = None

    def _gradient(self) -> torch.Tensor:
        assert self.flat.grad is not None
        return self.flat.grad

    def _members_per_pass(self, micro_batch_size: int, k: int) -> int:
        """On the CPU at most CPU_PASS_EXAMPLES examples per pass (the activations stay in cache)."""
        return max(1, CPU_PASS_EXAMPLES // micro_batch_size) if self.flat.device.type == "cpu" else k

    def _losses(self, lo: int, n: int, micro: torch.Tensor) -> torch.Tensor:
        flat = self.flat if n == len(self.flat) else self.flat.narrow(0, lo, n)
        buffers = {key: [t.narrow(0, lo, n) for t in stats] for key, stats in self.buffers.items()}
        logits = self.model.forward(flat, buffers, self.data.x_train[micro])
        # classes as dim 1: log_softmax then runs along the batch, much faster than over 10 classes
        return F.cross_entropy(logits.transpose(1, 2), self.data.y_train[micro], reduction="none").mean(1)

    def _keep(self, index: torch.Tensor) -> None:
        self.flat = self.flat.detach()[index].requires_grad_(True)
        self.buffers = {key: [t[index] for t in stats] for key, stats in self.buffers.items()}

    @torch.no_grad()
    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        """(mean cross-entropy, accuracy) of `members` on a split, eval-mode BatchNorm: each member's weights and
        BatchNorm statistics loaded into its own torch model (its TrainState's, which the stack writes again when
        the member leaves) and evaluated as a run alone evaluates. Evaluation shares nothing between members, and
        torch's own layers do it several times faster on a CPU than the batched ones (measured: a 5-member cnn1d
        group with BatchNorm on MNIST-1D 40k spent 93% of its time evaluating with them)."""
        flat = self.flat.detach()
        out = []
        for m, row in zip(members, self._rows(members)):
            self.model.load_member(m.state.model, flat, self.buffers, row)
            out.append(evaluate_batches(m.state.model, self.data.eval_batches(split, limit), CROSS_ENTROPY,
                                        m.cfg.precision))
        return out

    @torch.no_grad()
    def _unstack(self, member: Member, row: int) -> None:
        """Row `row`'s weights and BatchNorm statistics into the member's model, its optimizer state after."""
        model = member.state.model
        self.model.load_member(model, self.flat.detach(), self.buffers, row)
        opt = self.optimizer
        firsts = self.model.rows_to_torch(opt.buf[row:row + 1])
        seconds = self.model.rows_to_torch(opt.sq[row:row + 1]) if opt.sq is not None else [None] * len(firsts)
        params = dict(model.named_parameters())
        self._write_optimizer(member, ((params[slot.name], first[0], second[0] if second is not None else None)
                                       for slot, first, second in zip(self.model.slots, firsts, seconds)))


# ----------------------------------------------------------------------------- any model vmap can batch
class ParameterStack:
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
    """The loop's engine for a fused group of any model generic.probe accepts: the members' parameters as
    views of one flat (K, P) tensor (ParameterStack), their loss vmapped over the members, each on its own
    batch; a model's scaled_dot_product_attention runs as one call for all members (fused/attention.py)."""

    def __init__(self, members: list[Member], data: Dataset, loss: Loss, task: Task, device: torch.device):
        super().__init__(members, data)
        self.loss, self.task = loss, task
        self.model = members[0].state.model
        self.stack = ParameterStack([m.state.model for m in members], device)
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
