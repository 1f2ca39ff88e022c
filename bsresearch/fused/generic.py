"""Whether a fused group pays and whether vmap can fuse its model: `probe` and `calibrate` (the engine that
trains such a group is fused/engine.py's VmapEngine).

The built-in mlp and cnn1d have their own batched layers (fused/layers.py). Any other model, a user's
included, fuses through torch.func.vmap when vmap can take it (VmapEngine): its parameters become (K, ...)
tensors, views of one flat (K, P) tensor, so fused/optim.py updates all members in one set of operations;
gradients accumulate into one flat (K, P) buffer; the forward pass and the loss are vmapped over the members,
each on its own batch.

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

from ..losses import Loss
from ..model_io import Inputs
from ..runtime import synchronize
from .attention import batched_attention
from .engine import LAYOUT_WARNING, ParameterStack

CALIBRATION_STEPS = 5     # timed rounds (fused, then each member alone) after one untimed call of each
PAYS = 1.05               # fuse only when the fused step is at least this much faster per member


def _members(x: Inputs, k: int) -> Inputs:
    """The same inputs for k members (a tensor, or each of named tensors, expanded along a new first dim)."""
    return pytree.tree_map(lambda t: t.expand(k, *t.shape), x)


def probe(model: nn.Module, x: Inputs, y: torch.Tensor, loss: Loss) -> str | None:
    """Why vmap over stacked parameters cannot train `model` (one line), or None. Tries two members on the
    two examples (x, y): forward, loss and backward, in train mode, random draws forbidden."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats for m in model.modules()):
        return "BatchNorm's running statistics are updated in place in training, which vmap cannot batch"
    stack = ParameterStack([model, model], x.device)
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
