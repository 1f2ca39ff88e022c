"""What the loop's two engines for a fused group share: `FusedEngine`.

A fused engine holds K members' trainable state as one flat (K, P) parameter tensor, in the order of
`self.members`, with one FusedOptimizer (fused/optim.py) for all. `FusedEngine` is everything the two engines
do alike: a step's scaffolding (each member's next batch indices, the micro-batches, the members per
forward/backward pass, the accumulation rule of step.micro_batch_loss, the batch losses, one optimizer update
with every member's own lr, the step and examples bookkeeping), the weight statistics, and a member leaving
(its row written back into its own TrainState: weights, optimizer state and lr, then dropped).

The two engines differ in the forward program and in what follows from it (where the parameters live, the
BatchNorm buffers, evaluation):
- `trainer.StackEngine`: the built-in mlp and cnn1d through the batched layers of fused/layers.py, BatchNorm
  running statistics included; on a CPU the forward/backward passes go over slices of the members.
- `generic.VmapEngine`: any model torch.func.vmap can batch, through functional_call.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn as nn

from .. import schedule
from ..data import Dataset
from ..loop import Member, StepHooks
from ..step import micro_batch_loss
from .optim import FusedOptimizer


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
