"""The gradient noise scale of a device group, for free: a DDP communication hook (gradient_norms_hook, its state
GradientNorms) adds up each device's squared gradient norm before the all-reduce and the averaged gradient's
after it, and DeviceNoise, the loop's callback, feeds them to each member's NoiseMeter (meter.devices: B_small a
device's share of the batch, B_big the global batch) at every step.

The hook needs nothing of bsresearch's loop: any DDP model can register it (`ddp.register_comm_hook(
GradientNorms(world), gradient_norms_hook)`) and read `local` and `reduced` after each update's backward; they are
squared norms of the gradients DDP holds (scaled, where a GradScaler scales the loss: divide by its scale^2).

The hook's future: `future.then(callback)`, the usual way to hand DDP a Python hook's result (torch's own
allreduce_hook does it), leaves the Python callback and the future it makes with the thread that completes the
all-reduce (a gloo worker, NCCL's), which lets go of them, each taking the GIL, just after DDP has its result; a
main thread that reaches the interpreter's shutdown first makes that thread stop inside C++ and the process abort
("terminate called without an active exception", SIGABRT; core dumps of torchrun runs on a loaded 2-core machine
showed both: docs/own-trainer.md#torchrun). So the hook hands DDP a future of its own, completed from a callback
added with add_done_callback (no future left with the thread), and `GradientNorms.settle()`, which whoever
registered the hook calls when training ends, waits, the GIL released, until the thread has let go of every
callback: after that it holds nothing of Python."""
from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist

from ..loop import Callback, Loop, Member, Order
from .estimators import NoiseScaleEMA, noise_ema_columns
from .meter import NoiseMeter


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
        self.held = 0                              # the hook's callbacks not yet let go by the collective's thread
        self._let_go = threading.Condition()

    def hold(self) -> None:
        with self._let_go:
            self.held += 1

    def let_go(self) -> None:
        with self._let_go:
            self.held -= 1
            self._let_go.notify_all()

    def settle(self, timeout: float = 60.0) -> bool:
        """Wait, the GIL released, until the threads that complete the all-reduces have let go of every callback
        of this hook (at most `timeout` seconds: a collective that never completes keeps its callback); call it
        when training ends, before the process can exit. Returns whether they all have."""
        with self._let_go:
            return self._let_go.wait_for(lambda: self.held == 0, timeout)

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
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future(
        devices=[buffer.device] if buffer.device.type != "cpu" else None)
    dist.all_reduce(packed, async_op=True).get_future().add_done_callback(_AfterAllReduce(state, buffer, carry, done))
    return done


class _AfterAllReduce:
    """The hook's callback on the all-reduce's future: the averaged bucket back into DDP's buffer, its squared
    norm added to `reduced` (and the carried loss and norm kept), then `done` completed with the buffer (or with
    the all-reduce's error). Counted in state.held from its making until the thread that ran it lets go of it
    (its __del__), so that GradientNorms.settle can wait for that."""

    def __init__(self, state: GradientNorms, buffer: torch.Tensor, carry: bool,
                 done: torch.futures.Future[torch.Tensor]) -> None:
        self.state, self.buffer, self.carry, self.done = state, buffer, carry, done
        state.hold()

    def __call__(self, fut: torch.futures.Future[list[torch.Tensor]]) -> None:
        try:
            out = fut.value()[0]
            if self.carry:
                self.buffer.copy_(out[:-2])
                self.state.carried = out[-2:].float()
            assert self.state.reduced is not None
            mean = self.buffer.float()
            self.state.reduced += torch.dot(mean, mean)
        except Exception as error:   # the all-reduce failed (a process gone, a timeout): DDP's wait raises it
            self.done.set_exception(error)  # type: ignore[arg-type]
            return
        self.done.set_result(self.buffer)

    def __del__(self) -> None:
        self.state.let_go()


# DDP checks the hook's annotations as objects (this module's are strings: `from __future__ import annotations`)
gradient_norms_hook.__annotations__.update(bucket=dist.GradBucket, state=GradientNorms,
                                           **{"return": torch.futures.Future[torch.Tensor]})


class DeviceNoise(Callback):
    """The gradient noise scale of a device group at every step, from its communication hook (GradientNorms):
    the two-batch estimator with |G_small|^2 the devices' mean squared norm of their own gradients (B_small:
    a device's share, batch_size / devices) and |G_big|^2 the averaged gradient's (B_big: the global batch),
    fed to each member's NoiseMeter (decay noise_scale_ema); no extra forward or backward pass. Owns every
    member's meter (its EMA checkpointed under `key`) and its history columns (device_noise_b_simple_ema,
    device_noise_grad_sq_norm_ema, device_noise_trace_cov_ema). The engine leaves each step's pair as tensors
    (DeviceEngine.samples); they are read from the device in batches (one sync per FOLD_EVERY steps).
    A group of one device has no estimate (its share is the global batch): its columns stay NaN."""
    key = "device_noise_scale"
    order = Order.MEASURE
    FOLD_EVERY = 16

    def __init__(self) -> None:
        self.meters: dict[int, NoiseMeter] = {}   # member index -> its meter (none before its first fold)
        self.pending: dict[int, list[tuple[torch.Tensor, torch.Tensor, int, int]]] = {}

    def after_step(self, loop: Loop, losses: torch.Tensor) -> None:
        samples = getattr(loop.engine, "samples", {})
        for m in loop.active:
            if m.index in samples:
                self.pending.setdefault(m.index, []).append(samples[m.index])
                if len(self.pending[m.index]) >= self.FOLD_EVERY:
                    self.fold(m)

    def fold(self, member: Member) -> NoiseScaleEMA | None:
        """Feed `member`'s pending pairs to its meter; its EMA now (None before its first pair)."""
        pending = self.pending.pop(member.index, [])
        if pending:
            values = torch.stack([torch.stack([s, b]) for s, b, _, _ in pending]).tolist()   # one sync
            meter = self.meters.setdefault(member.index, NoiseMeter(member.cfg.noise_scale_ema))
            for (small, big), (_, _, b_small, b_big) in zip(values, pending):
                if b_small < b_big:   # a group of one device: its batch is the global batch, no estimate
                    meter.devices(small, big, b_small, b_big)
        meter = self.meters.get(member.index)
        return meter.ema if meter else None

    def columns(self, loop: Loop, member: Member) -> dict[str, Any]:
        return {f"device_{k}": v for k, v in noise_ema_columns(self.fold(member)).items()}

    def state_dict(self, member: Member) -> dict[str, Any] | None:
        self.fold(member)
        meter = self.meters.get(member.index)
        return meter.state_dict() if meter else None

    def load_state_dict(self, member: Member, state: dict[str, Any]) -> None:
        meter = self.meters.setdefault(member.index, NoiseMeter(float(state["decay"])))
        meter.load_state_dict(state)
