"""The loop's engine on one device of a group (DeviceEngine): the member's model in DistributedDataParallel, fed
its share of each global batch, with BatchNorm over the devices where the config asks (batchnorm.py) and the
noise scale's communication hook (noise.device.gradient_norms_hook) carrying the batch loss along."""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..data import Data
from ..engine import ModelEngine, prepare_update
from ..loop import Member, StepHooks
from ..losses import Loss, Task
from ..noise.device import GradientNorms, gradient_norms_hook
from ..runtime import is_out_of_memory
from ..step import optimizer_update
from .batchnorm import restore_batchnorm, swap_batchnorm
from .place import COLLECTIVE_TIMEOUT, DeviceLost, lost


class DeviceEngine(ModelEngine):
    """The loop's engine on one device of a group: the member's model wrapped in DistributedDataParallel (its
    TrainState keeps the plain module, so checkpoints do not depend on the number of devices), fed its share
    of each global batch. The global batch loss and the devices' mean squared gradient norm (noise.DeviceNoise)
    travel with the last gradient bucket's all-reduce (gradient_norms_hook): one all-reduce per bucket a step."""
    can_split = False

    def __init__(self, data: Data, loss: Loss, task: Task, member: Member, device: torch.device) -> None:
        super().__init__(data, loss, task)
        self.device, self.cfg = device, member.cfg
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        model = member.state.model
        self.swapped = swap_batchnorm(model, device.type == "cuda") if member.cfg.sync_batchnorm else []
        self.has_buffers = any(True for _ in model.buffers())
        renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
        sync: dict[str, Any] = {"forward_sync_buffers" if renamed else "broadcast_buffers": self.has_buffers}
        self.ddp: DistributedDataParallel | None = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, **sync)
        self.norms = GradientNorms(self.world)
        self.norms.losses = []
        self.recorded_loss = dataclasses.replace(self.loss, fn=recording(self.loss, self.norms))
        self.ddp.register_comm_hook(self.norms, gradient_norms_hook)
        self.samples: dict[int, tuple[torch.Tensor, torch.Tensor, int, int]] = {}   # member index -> last step's

    def share(self, idx: torch.Tensor) -> torch.Tensor:
        """This device's examples of a global batch, in the order it trains them: of each accumulation step
        (micro_batch_size examples, or the batch), the rank-th of `world` consecutive slices."""
        micro = self.cfg.micro_batch_size or len(idx)
        return idx.view(len(idx) // micro, self.world, micro // self.world)[:, self.rank].reshape(-1)

    def step(self, members: list[Member], lrs: list[float], hooks: list[StepHooks | None]) -> torch.Tensor:
        (member,), (lr,), (hook,) = members, lrs, hooks
        state, cfg, ddp = member.state, member.cfg, self.ddp
        assert ddp is not None, "the member has left the engine (remove)"
        if state.batches is None:
            state.batches = iter(self.data.train_batches(map(self.share, state.indices)))
        try:
            x, y = next(state.batches)
            big = len(y) * self.world
            micro = prepare_update(state.optimizer, cfg, lr, x, y, self.world)
            self.norms.reset(self.device)
            total = self._token_share(micro) if self.task.token_level else None
            value = optimizer_update(ddp, state.optimizer, micro, cfg.precision, state.scaler,
                                  self.recorded_loss,
                                  after_backward=hook.after_backward if hook else None,
                                  before_update=hook.before_update if hook else None, no_sync=ddp.no_sync,
                                  count=self.task.count if total is not None else None, total=total)
            assert self.norms.local is not None and self.norms.reduced is not None
            both = self.norms.carried
            if both is None:   # no bucket carried them (no gradient reached DDP): a collective of their own
                both = torch.stack([value.float(), self.norms.local]) / self.world
                dist.all_reduce(both)
        except Exception as exc:
            if lost(exc) and not is_out_of_memory(exc):
                raise DeviceLost(f"a collective failed (another device's process is gone, or the group waited "
                                 f"longer than {COLLECTIVE_TIMEOUT:g} s): {str(exc).strip().splitlines()[0]}") from exc
            raise
        scale_sq = state.scaler.get_scale() ** 2 if state.scaler else 1.0   # the squared norms of scaled gradients
        self.samples[member.index] = (both[1] / scale_sq, self.norms.reduced / scale_sq, len(y), big)
        state.step += 1
        state.examples_seen += big
        return both[:1]

    def _token_share(self, micro: list[tuple[Any, torch.Tensor]]) -> torch.Tensor:
        """For a token-level loss: the global batch's real tokens over the number of devices, what each device's
        micro-batch shares are of (step.optimizer_update's `total`), so that DDP's mean of the devices' gradients
        is the global batch's mean over its real tokens whatever each device's share holds (one all-reduce of
        one number a step). The micro-batches' shares also weight the loss the last bucket carries."""
        counts = [self.task.count(y) for _, y in micro]
        total = torch.stack(counts).sum().to(self.device, torch.float64)
        dist.all_reduce(total)
        total /= self.world
        self.norms.weights = [c.to(self.device, torch.float64) / total for c in counts]
        return total

    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        if self.has_buffers:   # every device evaluates rank 0's running statistics, as DDP trains with them
            for buffer in members[0].state.model.buffers():
                dist.broadcast(buffer, 0)
        return super().evaluate(members, split, limit)

    def remove(self, members: list[Member]) -> None:
        """The member leaves: its BatchNorm layers are its own again, and DDP is let go (its reducer holds the
        process group and its worker threads). A run that ended has first waited for those threads to let go of
        the noise hook's callbacks (run_rank: GradientNorms.settle), so none of them needs Python at exit."""
        restore_batchnorm(self.swapped)
        self.swapped = []
        self.ddp = None


def recording(loss: Loss, norms: GradientNorms) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """The run's loss, each micro-batch's value kept in `norms.losses` for the last bucket's all-reduce
    (GradientNorms). It stands in for the run's Loss under the same name, so that `loss: model` still feeds the
    model its labels (Loss.of). A function of the loss and the norms, not a method: the engine holds it, and a
    bound method would hold the engine back (a cycle that keeps DDP, and the group, alive until a collection)."""
    def recorded(output: Any, target: torch.Tensor) -> torch.Tensor:
        value = loss(output, target)
        assert norms.losses is not None
        norms.losses.append(value.detach())
        return value
    return recorded

