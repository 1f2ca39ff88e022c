"""One run on several devices: data-parallel training with torch.distributed (DistributedDataParallel; gloo on
the CPU, NCCL on CUDA), in the one setup (runsetup) and the one loop (loop.Loop).

    run_on_devices(cfg, run_dir)      train.run's path for cfg.devices > 1: join the group the environment
                                      gives (torchrun, a Slurm job step), or start cfg.devices processes as the
                                      launcher says (launcher.py: torch.multiprocessing here, or one Slurm job
                                      step per run, srun) and judge how they ended
    run_rank(cfg, run_dir, place)     one process of the group: the setup, its member, DeviceEngine, the loop
    step_task_main(folder)            one task of a run's Slurm job step (python -m bsresearch.device_task)

What batch size means here: `batch_size` is the global batch of one optimizer update, whatever the number of
devices. Every process draws the same global batches from the run's seeded BatchSampler (the order does not
depend on the number of devices); each takes its share, and each accumulation step splits into one
per-device batch of batch_size / (devices x accumulation steps) examples per device (DeviceEngine.share).
Every device's loss is the mean over its share, micro-batches weighted as step.micro_batch_loss says, and DDP
averages the devices' gradients: the update is the global batch's mean-loss gradient, so a run on N devices
equals the run on one device at the same global batch to floating-point rounding (BatchNorm aside). The lr
follows the global batch (schedule.lr_at). Micro-batches before the last one skip the all-reduce (no_sync).

BatchNorm: each device normalises its own share (ghost BatchNorm at the per-device batch; the running
statistics are the first device's, which DDP broadcasts), or with sync_batchnorm the global batch (torch's
SyncBatchNorm on CUDA; on the CPU, AllReduceBatchNorm all-reduces the count, sum and sum of squares).

The noise scale for free: a DDP communication hook (GradientNorms) adds up each device's squared gradient
norm before the all-reduce and the averaged gradient's after it; DeviceNoiseScale turns them into the
two-batch B_simple (B_small: a device's share of the batch, B_big: the global batch) at every step.

Rank 0 alone writes the run directory (Recording, Checkpointing); every rank runs the callbacks that decide
(Evaluation on identical weights, Divergence on the all-reduced batch loss), so all ranks stop together.
A collective waits at most COLLECTIVE_TIMEOUT seconds; a lost process ends the run `died`.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import inspect
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from . import schedule
from .callbacks import Checkpointing, Divergence, Evaluation, Progress, Recording
from .config import ConfigError, RunConfig
from .data import Data
from .engine import ModelEngine
from .launcher import allocation_has_gpus, check_launcher, device_launcher
from .loop import Callback, Loop, Member, RunResult, StepHooks
from .losses import Loss, Task
from .noise_tracker import NoiseScaleEMA, noise_ema_columns, update_noise_ema
from .paths import with_this_package
from .rundir import RunDir, check_writable
from .runsetup import finished_result, out_of_memory_result, run_setup
from .runtime import derive_seed, is_out_of_memory, model_randomness, oom_message, provenance, resolve_device
from .step import training_step

__all__ = ["COLLECTIVE_TIMEOUT", "AllReduceBatchNorm", "DeviceEngine", "DeviceNoiseScale", "GradientNorms",
           "GroupPlace", "group_from_environment", "run_on_devices", "run_rank", "slurm_place", "srun_command"]

# Seconds a process waits in one collective before it gives up (torch.distributed's timeout): the bound on a
# hang when a device's process is lost without its connections closing (NCCL). BSRESEARCH_COLLECTIVE_TIMEOUT
# sets it. On the CPU (gloo) a killed process closes its sockets and the others fail at once.
COLLECTIVE_TIMEOUT = float(os.environ.get("BSRESEARCH_COLLECTIVE_TIMEOUT", "300"))
JOIN_POLL_SECONDS = 0.2      # how often the starting process looks at its device processes
LOST = "DeviceLost"          # the error's prefix of a run whose group lost a process ("died")


class DeviceLost(RuntimeError):
    """A collective failed: another process of the device group is gone (or timed out)."""


# ----------------------------------------------------------------------------- the group's place
@dataclass(frozen=True)
class GroupPlace:
    """This process's place in a device group: its rank, the group's size, its device on this node, and how
    the group meets (torch.distributed's init_method)."""
    rank: int
    world: int
    local_rank: int
    init_method: str


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list ('gpu[03-05,07],cpu1' -> 'gpu03')."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=20, check=True).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    head = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not head:
        return nodelist
    prefix, ranges = head.group(1), head.group(2)
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


def slurm_place(env: dict[str, str], init_method: str | None = None) -> GroupPlace | None:
    """This process's place in a Slurm job step of more than one task: SLURM_PROCID of SLURM_STEP_NUM_TASKS,
    device SLURM_LOCALID of its node; the group meets at `init_method`, by default tcp://MASTER_ADDR:MASTER_PORT
    (MASTER_ADDR default the step's first node, MASTER_PORT default 20000 + the job id mod 20000). None outside
    such a step: a batch script (sbatch --ntasks N) has SLURM_PROCID 0 and SLURM_NTASKS N but is no task of a
    step (srun sets SLURM_STEP_NUM_TASKS), and joining a group of N there would wait for tasks that never come."""
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", "1") or 1)
    if "SLURM_PROCID" not in env or tasks <= 1:
        return None
    if init_method is None:
        host = env.get("MASTER_ADDR") or first_host(env.get("SLURM_STEP_NODELIST") or
                                                   env.get("SLURM_JOB_NODELIST", "localhost"))
        port = env.get("MASTER_PORT") or str(20000 + int(env.get("SLURM_JOB_ID", "0") or 0) % 20000)
        init_method = f"tcp://{host}:{port}"
    return GroupPlace(int(env["SLURM_PROCID"]), tasks, int(env.get("SLURM_LOCALID", "0")), init_method)


def group_from_environment(env: dict[str, str] | None = None, slurm: bool = True) -> GroupPlace | None:
    """The device group this process was started in: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT, or (unless `slurm` is False) a Slurm job step's (slurm_place). None outside a group of more
    than one process."""
    env = dict(os.environ) if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return GroupPlace(int(env["RANK"]), world, int(env.get("LOCAL_RANK", "0")), "env://") if world > 1 else None
    return slurm_place(env) if slurm else None


def group_device(cfg: RunConfig, local_rank: int) -> torch.device:
    """This process's device: the CPU, or CUDA device `local_rank` (of those the process sees)."""
    device = resolve_device(cfg.device)
    if device.type != "cuda":
        return device
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"devices {cfg.devices}: process {local_rank} of this node has no CUDA device (it sees "
                          f"{torch.cuda.device_count()}); give each run as many GPUs as it has devices")
    return torch.device("cuda", local_rank)


@contextlib.contextmanager
def process_group(place: GroupPlace, device: torch.device) -> Iterator[None]:
    """Join the group (gloo on the CPU, NCCL on CUDA) for the duration; collectives time out after
    COLLECTIVE_TIMEOUT seconds."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=place.init_method,
                            rank=place.rank, world_size=place.world,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def lost(exc: BaseException) -> bool:
    """Whether `exc` says a collective failed: another process is gone, or the group timed out."""
    if isinstance(exc, (DeviceLost, dist.DistError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "Gloo", "NCCL", "Connection closed", "Connection reset", "timed out",
                                  "Broken pipe", "ProcessGroup"))


# ----------------------------------------------------------------------------- BatchNorm over the devices
class _SumOverDevices(torch.autograd.Function):
    """The sum of a tensor over the group's devices; its gradient is the sum of the devices' gradients (each
    device's loss depends on every device's input through the sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        dist.all_reduce(out)
        return out


class AllReduceBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the global batch on the CPU, where torch's SyncBatchNorm does not run: in training, the
    count, sum and sum of squares of each channel are all-reduced (differentiably: the backward all-reduces
    their gradients) and every device normalises with the global mean and (biased) variance; the running
    statistics take the global mean and unbiased variance. The statistics are summed in float64. Outside
    a group, or in eval mode, it is BatchNorm."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2-D input, got {x.dim()}-D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)
        channels, dims = x.shape[1], [0, *range(2, x.dim())]
        x64 = x.double()
        count = torch.full((1,), x.numel() // channels, dtype=torch.float64, device=x.device)
        total = _SumOverDevices.apply(torch.cat([x64.sum(dims), (x64 * x64).sum(dims), count]))
        n = total[-1]
        mean = total[:channels] / n
        var = (total[channels:2 * channels] / n - mean * mean).clamp_min(0)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                assert self.num_batches_tracked is not None
                self.num_batches_tracked.add_(1)
                factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                unbiased = var * n / (n - 1).clamp_min(1)
                self.running_mean.mul_(1 - factor).add_(factor * mean.to(self.running_mean.dtype))
                self.running_var.mul_(1 - factor).add_(factor * unbiased.to(self.running_var.dtype))
        shape = [1, channels] + [1] * (x.dim() - 2)
        out = (x - mean.to(x.dtype).view(shape)) * torch.rsqrt(var.to(x.dtype) + self.eps).view(shape)
        if self.weight is not None and self.bias is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def _sync_twin(module: nn.modules.batchnorm._BatchNorm, cuda: bool) -> nn.Module:
    """A BatchNorm over the global batch that shares `module`'s parameters and buffers (the same tensors, so
    the optimizer and the checkpoint see no change)."""
    twin: nn.modules.batchnorm._BatchNorm
    if cuda:
        twin = nn.SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                module.track_running_stats)
    else:
        twin = AllReduceBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats)
    for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
        setattr(twin, name, tensor)
    twin.train(module.training)
    return twin


def swap_batchnorm(model: nn.Module, cuda: bool) -> list[tuple[nn.Module, str, nn.Module]]:
    """Put a global-batch BatchNorm (_sync_twin) in place of every BatchNorm of `model`; returns (parent, name,
    original) of each, for restore_batchnorm."""
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.modules.batchnorm._BatchNorm) and \
                    not isinstance(child, (AllReduceBatchNorm, nn.SyncBatchNorm)):
                setattr(parent, name, _sync_twin(child, cuda))
                swapped.append((parent, name, child))
    return swapped


def restore_batchnorm(swapped: list[tuple[nn.Module, str, nn.Module]]) -> None:
    """Put the original BatchNorm modules back (their tensors are the ones that trained)."""
    for parent, name, original in swapped:
        original.train(getattr(parent, name).training)
        setattr(parent, name, original)


# ----------------------------------------------------------------------------- the noise scale's hook
class GradientNorms:
    """The state of the communication hook `gradient_norms_hook`: over one optimizer update, this device's
    squared gradient norm before the all-reduce (`local`, of its share's mean-loss gradient) and the squared
    norm of the averaged gradient after it (`reduced`), summed over DDP's buckets; `allreduces` counts the
    bucket all-reduces (a test counts them per update). Where `losses` collects the update's micro-batch losses
    (DeviceEngine), the last bucket's all-reduce carries this device's mean loss and `local` too, so that
    `carried` holds the global batch loss and the devices' mean |g|^2 with no collective of their own."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.local: torch.Tensor | None = None
        self.reduced: torch.Tensor | None = None
        self.losses: list[torch.Tensor] | None = None
        self.weights: list[torch.Tensor] | None = None   # the micro-batches' token shares (a token-level loss)
        self.carried: torch.Tensor | None = None
        self.allreduces = 0

    def reset(self, device: torch.device) -> None:
        self.local = torch.zeros((), device=device)
        self.reduced = torch.zeros((), device=device)
        self.carried = None
        self.weights = None
        if self.losses is not None:
            self.losses = []


def gradient_norms_hook(state: GradientNorms, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's all-reduce of a bucket (the mean over devices, as DDP's default), recording |g|^2 of this device's
    bucket before it and of the averaged bucket after it into `state`: two dot products per bucket, no
    extra collective (the last bucket carries the loss and the local norm along, where state.losses is kept)."""
    buffer = bucket.buffer()
    state.allreduces += 1
    if state.local is None or state.reduced is None:
        state.reset(buffer.device)
    assert state.local is not None
    flat = buffer.float()
    state.local += torch.dot(flat, flat)
    carry = bool(state.losses) and bucket.is_last()
    if carry:
        assert state.losses is not None
        losses = torch.stack(state.losses).float()
        loss = losses.mean() if state.weights is None else (losses.double() * torch.stack(state.weights)).sum()
        extra = torch.stack([loss.float(), state.local]).to(buffer.dtype)
        packed = torch.cat([buffer, extra]).div_(state.world)
    else:
        packed = buffer.div_(state.world)
    future = dist.all_reduce(packed, async_op=True).get_future()

    def after(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        out = fut.value()[0]
        if carry:
            buffer.copy_(out[:-2])
            state.carried = out[-2:].float()
        assert state.reduced is not None
        mean = buffer.float()
        state.reduced += torch.dot(mean, mean)
        return buffer
    return future.then(after)


# DDP checks the hook's annotations as objects (this module's are strings: `from __future__ import annotations`)
gradient_norms_hook.__annotations__.update(bucket=dist.GradBucket, state=GradientNorms,
                                           **{"return": torch.futures.Future[torch.Tensor]})


# ----------------------------------------------------------------------------- the engine
class DeviceEngine(ModelEngine):
    """The loop's engine on one device of a group: the member's model wrapped in DistributedDataParallel (its
    TrainState keeps the plain module, so checkpoints do not depend on the number of devices), fed its share
    of each global batch. The global batch loss and the devices' mean squared gradient norm (DeviceNoiseScale)
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
        self.ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                           **sync)
        self.norms = GradientNorms(self.world)
        self.norms.losses = []
        self.recorded_loss = dataclasses.replace(self.loss, fn=self._recorded_loss)   # Loss.of feeds it as the run's
        self.ddp.register_comm_hook(self.norms, gradient_norms_hook)
        self.samples: dict[int, tuple[torch.Tensor, torch.Tensor, int, int]] = {}   # member index -> last step's

    def share(self, idx: torch.Tensor) -> torch.Tensor:
        """This device's examples of a global batch, in the order it trains them: of each accumulation step
        (micro_batch_size examples, or the batch), the rank-th of `world` consecutive slices."""
        micro = self.cfg.micro_batch_size or len(idx)
        return idx.view(len(idx) // micro, self.world, micro // self.world)[:, self.rank].reshape(-1)

    def step(self, members: list[Member], lrs: list[float], hooks: list[StepHooks | None]) -> torch.Tensor:
        (member,), (lr,), (hook,) = members, lrs, hooks
        state, cfg = member.state, member.cfg
        if state.batches is None:
            state.batches = iter(self.data.train_batches(map(self.share, state.indices)))
        try:
            x, y = next(state.batches)
            big = len(y) * self.world
            for group in state.optimizer.param_groups:
                group["lr"] = lr
                if "betas" in group:
                    group["betas"] = (group["betas"][0], schedule.adam_beta2_at(cfg, big))
            part = (cfg.micro_batch_size or big) // self.world
            self.norms.reset(self.device)
            micro = list(zip(x.split(part), y.split(part)))
            total = self._token_share(micro) if self.task.token_level else None
            value = training_step(self.ddp, state.optimizer, micro, cfg.precision, state.scaler,
                                  self.recorded_loss,
                                  after_backward=hook.after_backward if hook else None,
                                  before_update=hook.before_update if hook else None, no_sync=self.ddp.no_sync,
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
        micro-batch shares are of (step.training_step's `total`), so that DDP's mean of the devices' gradients
        is the global batch's mean over its real tokens whatever each device's share holds (one all-reduce of
        one number a step). The micro-batches' shares also weight the loss the last bucket carries."""
        counts = [self.task.count(y) for _, y in micro]
        total = torch.stack(counts).sum().to(self.device, torch.float64)
        dist.all_reduce(total)
        total /= self.world
        self.norms.weights = [c.to(self.device, torch.float64) / total for c in counts]
        return total

    def _recorded_loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        """The run's loss, each micro-batch's value kept for the last bucket's all-reduce (GradientNorms). It
        stands in for the run's Loss under the same name, so that `loss: model` still feeds the model its
        labels (Loss.of)."""
        value = self.loss(output, target)
        assert self.norms.losses is not None
        self.norms.losses.append(value.detach())
        return value

    def evaluate(self, members: list[Member], split: str, limit: int | None) -> list[tuple[float, float | None]]:
        if self.has_buffers:   # every device evaluates rank 0's running statistics, as DDP trains with them
            for buffer in self.ddp.module.buffers():
                dist.broadcast(buffer, 0)
        return super().evaluate(members, split, limit)

    def remove(self, members: list[Member]) -> None:
        restore_batchnorm(self.swapped)
        self.swapped = []


class DeviceNoiseScale(Callback):
    """The gradient noise scale of a device group at every step, from its communication hook (GradientNorms):
    the two-batch estimator with |G_small|^2 the devices' mean squared norm of their own gradients (B_small:
    a device's share, batch_size / devices) and |G_big|^2 the averaged gradient's (B_big: the global batch),
    into an EMA of decay noise_scale_ema (noise_tracker); no extra forward or backward pass. Owns the EMA of
    every member (checkpointed) and its history columns (device_noise_b_simple_ema, device_noise_grad_sq_norm_ema,
    device_noise_trace_cov_ema). Samples are read from the device in batches (one sync per FOLD_EVERY steps).
    A group of one device has no estimate (its share is the global batch): its columns stay NaN."""
    key = "device_noise_scale"
    FOLD_EVERY = 16

    def __init__(self) -> None:
        self.ema: dict[int, NoiseScaleEMA] = {}
        self.pending: dict[int, list[tuple[torch.Tensor, torch.Tensor, int, int]]] = {}

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        samples = getattr(loop.engine, "samples", {})
        for m in loop.active:
            if m.index in samples:
                self.pending.setdefault(m.index, []).append(samples[m.index])
                if len(self.pending[m.index]) >= self.FOLD_EVERY:
                    self.fold(m)

    def fold(self, member: Member) -> NoiseScaleEMA | None:
        pending = self.pending.pop(member.index, [])
        if pending:
            values = torch.stack([torch.stack([s, b]) for s, b, _, _ in pending]).tolist()   # one sync
            ema = self.ema.get(member.index) or NoiseScaleEMA(member.cfg.noise_scale_ema)
            for (small, big), (_, _, b_small, b_big) in zip(values, pending):
                if b_small < b_big:   # a group of one device: its batch is the global batch, no estimate
                    ema = update_noise_ema(ema, small, big, b_small, b_big)
            self.ema[member.index] = ema
        return self.ema.get(member.index)

    def columns(self, loop: Loop, member: Member) -> dict[str, Any]:
        return {f"device_{k}": v for k, v in noise_ema_columns(self.fold(member)).items()}

    def state_dict(self, member: Member) -> dict[str, Any] | None:
        ema = self.fold(member)
        return dataclasses.asdict(ema) if ema else None

    def load_state_dict(self, member: Member, state: dict[str, Any]) -> None:
        self.ema[member.index] = NoiseScaleEMA(**state)


class GroupRecording(Recording):
    """Recording on the group's rank 0: a run whose group lost a process ends `died`, not `failed`."""

    def on_finish(self, loop: Loop, member: Member) -> None:
        if member.outcome == "failed" and (member.error or "").startswith(LOST):
            member.outcome, member.error = "died", (member.error or "").removeprefix(f"{LOST}: ")
        super().on_finish(loop, member)


# ----------------------------------------------------------------------------- one process of the group
def run_rank(cfg: RunConfig, run_dir: str | Path | None, place: GroupPlace, progress: bool | None = None,
             overwrite: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """Train `cfg` as process `place.rank` of its device group: the one setup on this process's device, the
    member (every rank resumes the same checkpoint), DeviceEngine, and the loop; rank 0 writes the run
    directory. `callbacks` run on every rank (a callback that stops a member must decide the same on all)."""
    if place.world != cfg.devices:
        raise ConfigError(f"devices {cfg.devices}, but the group this process was started in has {place.world} "
                          f"processes: start it with as many as the config's devices")
    lead = place.rank == 0
    finished = None if overwrite else finished_result(run_dir)
    if finished is not None:
        return finished
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd and lead:
        check_writable(rd.path, "--runs or --run-dir")
    device = group_device(cfg, place.local_rank)
    with process_group(place, device):
        try:
            setup = run_setup(cfg, device=device)
            member = setup.member(0, cfg, rd, resume=not overwrite)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return out_of_memory_result(cfg, run_dir if lead else None, device, oom_message(exc))
        # on the group's device: NCCL (CUDA) takes no CPU tensors
        steps = [torch.zeros((), dtype=torch.long, device=device) for _ in range(place.world)]
        dist.all_gather(steps, torch.tensor(member.state.step, device=device))
        if len({int(s) for s in steps}) != 1:
            raise ConfigError(f"the processes of run {run_dir} start at different steps {[int(s) for s in steps]}: "
                              f"its checkpoint changed while they read it; start the run again")
        if not lead:
            member.rd = None
        engine = DeviceEngine(setup.data, setup.loss, setup.task, member, device)
        own: list[Callback] = [Evaluation(), Divergence(), DeviceNoiseScale()]
        if lead:
            status = {"devices": {"count": place.world, "backend": dist.get_backend(),
                                  "batchnorm": schedule.device_values(cfg).get("batchnorm_statistics")}}
            own += [Progress(progress), GroupRecording(status)]
        with model_randomness(cfg.seed, device, member.model_rng if lead else None):
            if not lead:   # the other devices' dropout: their own stream, not a copy of rank 0's
                torch.manual_seed(derive_seed(cfg.seed, f"model/device-{place.rank}/step-{member.state.step}"))
            setup.loop([member], engine, [*own, *callbacks, Checkpointing()]).run()
    return member.result or RunResult(member.outcome, {}, member.state.history, None, member.error, member.state.model)


# ----------------------------------------------------------------------------- starting the group
def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when the process that started it dies (no orphaned device
    process)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)   # PR_SET_PDEATHSIG


def _rank_report(place: GroupPlace, cfg: RunConfig, run_dir: str | None, reports: str | Path,
                 progress: bool | None, overwrite: bool, callbacks: Sequence[Callback]) -> None:
    """A device process of a group this package started (either launcher): run its rank, and leave a report of
    how it ended in `reports`/rank<r>.json, which the starting process reads (_read_reports, _judge). Exits 2
    on a ConfigError, 1 unless the run ended ok or diverged."""
    report: dict[str, Any]
    try:
        result = run_rank(cfg, run_dir, place, progress, overwrite, callbacks)
        report = {"state": result.state, "error": result.error}
        if place.rank == 0 and run_dir is None:
            report.update(metrics=result.metrics, history=result.history)
    except ConfigError as exc:
        report = {"config_error": str(exc)}
    except BaseException as exc:
        report = {"state": "died" if lost(exc) else "oom" if is_out_of_memory(exc) else "failed",
                  "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    _write_report(reports, place.rank, report)
    if "config_error" in report:
        raise SystemExit(2)
    if report["state"] not in ("ok", "diverged"):
        raise SystemExit(1)


def _write_report(reports: str | Path, rank: int, report: dict[str, Any]) -> None:
    Path(reports, f"rank{rank}.json").write_text(json.dumps(report, default=str))


def _read_reports(reports: str | Path, devices: int) -> dict[int, dict[str, Any]]:
    """rank -> the report each device process left (_rank_report); a process that left none is missing."""
    return {i: json.loads(p.read_text()) for i in range(devices) if (p := Path(reports, f"rank{i}.json")).exists()}


def _rank_main(index: int, cfg: RunConfig, run_dir: str | None, init_method: str, reports: str,
               progress: bool | None, overwrite: bool, callbacks: Sequence[Callback]) -> None:
    """A device process started by torch.multiprocessing (launcher processes): process `index` of this machine."""
    _die_with_parent()
    _rank_report(GroupPlace(index, cfg.devices, index, init_method), cfg, run_dir, reports, progress, overwrite,
                 callbacks)


def start_method() -> str:
    """forkserver: the device processes are forked from a server process started once per process (it has
    imported this module, so later groups start in a moment), never from the caller, whose threads (a notebook's,
    a progress bar's, a CUDA context) a fork would copy mid-lock. BSRESEARCH_START_METHOD chooses another."""
    method = os.environ.get("BSRESEARCH_START_METHOD") or "forkserver"
    if method == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload([__name__])
    return method


def run_on_devices(cfg: RunConfig, run_dir: str | Path | None = None, progress: bool | None = None,
                   overwrite: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """train.run for cfg.devices > 1. In a group the environment gives (torchrun, srun), train this process's
    rank; otherwise start cfg.devices processes, one per device, as the launcher (launcher.py) says: with
    torch.multiprocessing here, or as one Slurm job step (srun). Wait for them and return the run's result.
    A process that dies, fails or runs out of memory ends the others and the run: `died` (killed), `oom` or
    `failed`; a finished run directory is never written again.

    With the srun launcher this process is the one that starts the step: the Slurm variables of its own
    allocation (an sbatch script's SLURM_PROCID) do not make it a member of a group."""
    chosen = device_launcher()
    place = group_from_environment(slurm=chosen != "srun")
    if place is not None:
        return run_rank(cfg, run_dir, place, progress, overwrite, callbacks)
    if chosen == "srun":
        check_launcher(chosen)
    finished = None if overwrite else finished_result(run_dir)
    if finished is not None:
        return finished
    rd = RunDir(run_dir) if run_dir is not None else None
    if rd:
        check_writable(rd.path, "--runs or --run-dir")
    start = _start_step if chosen == "srun" else _start_processes
    reports, how_lost, device = start(cfg, rd, progress, overwrite, tuple(callbacks))
    for i in sorted(reports):
        if "config_error" in reports[i]:
            raise ConfigError(reports[i]["config_error"])
    return _judge(cfg, rd, reports, how_lost, device)


def _start_processes(cfg: RunConfig, rd: RunDir | None, progress: bool | None, overwrite: bool,
                     callbacks: tuple[Callback, ...]) -> tuple[dict[int, dict[str, Any]], str | None, torch.device]:
    """Launcher processes: cfg.devices processes of this machine (torch.multiprocessing), watched every
    JOIN_POLL_SECONDS; the first to fail ends the others (SIGTERM, then SIGKILL). Returns their reports, how the
    group was lost (None: every process exited 0) and the device type."""
    device = group_device(cfg, cfg.devices - 1).type   # every process has a device
    with tempfile.TemporaryDirectory(prefix="bsresearch-devices-") as tmp:
        context = mp.start_processes(
            _rank_main, args=(cfg, str(rd.path) if rd else None, f"file://{tmp}/rendezvous", tmp, progress,
                              overwrite, callbacks),
            nprocs=cfg.devices, join=False, start_method=start_method())
        failure: BaseException | None = None
        try:
            while not context.join(JOIN_POLL_SECONDS):
                pass
        except mp.ProcessExitedException as exc:
            failure = exc
        except mp.ProcessRaisedException as exc:
            failure = exc
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        reports = _read_reports(tmp, cfg.devices)
    return reports, _lost_message(failure) if failure is not None else None, torch.device(device)


# ----------------------------------------------------------------------------- one Slurm job step per run
STEP_FILE = "step.pkl"       # in the step's folder: what its tasks train (device_task.py reads it)
STEP_STOP_GRACE = 10.0       # seconds between srun's SIGTERM (it forwards it to the tasks) and SIGKILL


def srun_command(devices: int, gpus: bool, folder: str | Path, name: str = "run", threads: int = 0) -> list[str]:
    """The job step of one run: `devices` tasks of `python -m bsresearch.device_task FOLDER`, one GPU each on
    CUDA (none asked for on the CPU), resources of their own (--exclusive: steps side by side never share a
    GPU), and the whole step ended when one task fails (--kill-on-bad-exit)."""
    command = ["srun", "--ntasks", str(devices)]
    if gpus:
        command += ["--gpus-per-task", "1"]
    if threads > 0:
        command += ["--cpus-per-task", str(threads)]
    return [*command, "--exclusive", "--kill-on-bad-exit=1", "--job-name", f"bsresearch-{name}",
            sys.executable, "-m", "bsresearch.device_task", str(folder)]


def _step_uses_gpus(cfg: RunConfig) -> bool:
    """Whether the step's tasks train on CUDA: device cuda, or auto where this process sees a GPU or the Slurm
    allocation lists some (the tasks may run on other nodes than this one)."""
    if cfg.device == "cpu":
        return False
    return cfg.device.startswith("cuda") or torch.cuda.is_available() or allocation_has_gpus()


def _start_step(cfg: RunConfig, rd: RunDir | None, progress: bool | None, overwrite: bool,
                callbacks: tuple[Callback, ...]) -> tuple[dict[int, dict[str, Any]], str | None, torch.device]:
    """Launcher srun: the run as one job step of cfg.devices tasks in the current Slurm allocation. The tasks
    meet through a file (torch.distributed's file:// init) in a fresh folder of the run directory (of the working
    directory for a run without one), which every node sees on a cluster's shared filesystem and no other step
    shares; the folder also carries what they train (STEP_FILE) and their reports, and is removed afterwards.
    srun gets SIGTERM (which it forwards to the tasks) if this process dies or is interrupted."""
    gpus = _step_uses_gpus(cfg)
    home = (rd.path if rd else Path.cwd()).resolve()   # absolute: a task's working directory may differ
    home.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".devices-", dir=home))
    try:
        payload = pickle.dumps((cfg, str(home) if rd else None, progress, overwrite, callbacks))
        (folder / STEP_FILE).write_bytes(pickle.dumps({"sys_path": list(sys.path), "payload": payload}))
        env = with_this_package(dict(os.environ))   # the tasks import this very bsresearch
        command = srun_command(cfg.devices, gpus, folder, home.name if rd else "run", cfg.threads)
        proc = subprocess.Popen(command, env=env, preexec_fn=lambda: _die_with_parent(signal.SIGTERM))
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:   # interrupted: srun forwards SIGTERM to its tasks
                proc.terminate()
                try:
                    proc.wait(timeout=STEP_STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        reports = _read_reports(folder, cfg.devices)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    how_lost = None
    if code != 0:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        silent = [str(i) for i in range(cfg.devices) if i not in reports]
        how_lost = (f"the Slurm job step (srun) {how}" +
                    (f"; device task(s) {', '.join(silent)} ended without a report (killed or lost)" if silent else "")
                    + "; the other tasks were stopped")
    return reports, how_lost, torch.device("cuda" if gpus else "cpu")


def step_task_main(folder: str | Path) -> None:
    """One task of a run's job step (`python -m bsresearch.device_task FOLDER`, started by srun): its place
    from Slurm's variables (slurm_place), meeting at FOLDER/rendezvous; then its rank, and its report, as a
    device process of launcher processes does (_rank_report). With one GPU per task (--gpus-per-task 1, which
    Slurm binds to the task), that GPU is device 0 of those the task sees."""
    place = slurm_place(dict(os.environ), f"file://{Path(folder).resolve()}/rendezvous")
    if place is None:
        raise SystemExit("bsresearch.device_task: not a task of a Slurm job step of several tasks "
                         "(SLURM_PROCID, SLURM_STEP_NUM_TASKS); it is started by the srun launcher")
    step = pickle.loads(Path(folder, STEP_FILE).read_bytes())
    for entry in reversed(step["sys_path"]):   # the callbacks' modules, importable as in the starting process
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        cfg, run_dir, progress, overwrite, callbacks = pickle.loads(step["payload"])
    except Exception as exc:   # e.g. a callback whose module this node cannot import: the run failed
        _write_report(folder, place.rank, {"state": "failed", "traceback": traceback.format_exc(),
                                           "error": f"the task could not read its run: {type(exc).__name__}: {exc}"})
        raise SystemExit(1) from None
    if torch.cuda.is_available() and torch.cuda.device_count() == 1:
        place = dataclasses.replace(place, local_rank=0)
    _rank_report(place, cfg, run_dir, folder, progress, overwrite, callbacks)


# ----------------------------------------------------------------------------- how the run ended
def _judge(cfg: RunConfig, rd: RunDir | None, reports: dict[int, dict[str, Any]], how_lost: str | None,
           device: torch.device) -> RunResult:
    """The run's result once its processes have ended (either launcher). A finished run directory stands.
    Otherwise the cause: a process's own failure or out-of-memory (one device's is the run's), else a process
    that was killed or lost (`died`; `how_lost` says how the launcher saw it), else what rank 0 recorded."""
    if rd and rd.is_finished():
        return RunResult(rd.state() or "ok", rd.metrics(), rd.history_rows(), rd.path)
    own = [(i, r) for i, r in sorted(reports.items()) if r.get("state") in ("oom", "failed")]
    if own:
        i, r = min(own, key=lambda item: item[1]["state"] != "oom")
        state, error, trace = r["state"], f"device {i}: {r.get('error')}", r.get("traceback")
    elif how_lost is not None or len(reports) < cfg.devices:
        state, trace = "died", None
        error = how_lost if how_lost is not None else "a device process ended without a report"
    elif rd is None and 0 in reports:
        r = reports[0]
        return RunResult(r["state"], r.get("metrics", {}), r.get("history", []), None, r.get("error"))
    else:
        state, error, trace = (reports.get(0) or {}).get("state", "died"), (reports.get(0) or {}).get("error"), None
    if rd:
        rd.write_status(state, error=error, traceback=trace, provenance=provenance(device))
    return RunResult(state, rd.metrics() if rd else {}, rd.history_rows() if rd and
                     (rd.path / "history.csv").exists() else [], rd.path if rd else None, error)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _lost_message(failure: BaseException) -> str:
    """'device process 1 (pid 123) was killed by SIGKILL' from torch.multiprocessing's exception."""
    index, pid = getattr(failure, "error_index", "?"), getattr(failure, "pid", "?")
    name = getattr(failure, "signal_name", None)
    code = getattr(failure, "exit_code", None)
    how = f"was killed by {name}" if name else f"exited with status {code}" if code is not None else \
        f"raised {str(failure).strip().splitlines()[-1] if str(failure).strip() else type(failure).__name__}"
    return f"device process {index} (pid {pid}) {how}; the other processes were stopped"
