"""The gradient noise scale (McCandlish et al. 2018), in one place: B_simple = tr(Sigma) / |G|^2 in examples (or
tokens), and B_noise with the Hessian.

The core, framework-free (plain numbers in, plain numbers out; a plain loop, bsresearch's loop and a
framework's callback all feed it):

    estimators   two_batch_estimate(sq_small, sq_big, b_small, b_big) -> (|G|^2, tr(Sigma)); its mean over
                 several small batches (micro_batch_estimate); NoiseScaleEMA and update_noise_ema (the
                 moving average, ratio after averaging); noise_ema_columns (a history's noise_*_ema columns);
                 squared_grad_norm(model) (|.grad|^2, no sync)
    meter        NoiseMeter(decay): one object per run, fed once a step from whichever pair the step has:
                     meter.micro_batches(sq_norms, sizes, sq_norm_big, b_big)    gradient accumulation
                     meter.devices(local_sq_norm, reduced_sq_norm, b_local, b_global)   DDP's hook
                     meter.pair(sq_small, sq_big, b_small, b_big)                a batch and part of it
                 each returning a NoiseSample (b_simple this step, b_simple_ema, estimator, .row());
                 meter.b_simple is the EMA, meter.state_dict() its checkpoint
                 Squared norms are of MEAN-loss gradients over their own batch (undo a trainer's division
                 by accumulation steps or token counts and a GradScaler's scale first); sizes in the units
                 the loss averages over (examples, or real tokens).

Measuring a trained model (no training loop):

    exact        gradient_noise_scale: exact per-example statistics (vmap), bootstrap interval, per layer,
                 returning NoiseScale (the one class of that name: a result); per_example_gradients
    pairs        two_batch_noise_scale (TwoBatchNoiseScale), two_batch_pairs and two_batch_summary (draws of
                 pairs and the bootstrap interval of their ratio of averages); small_batch_sq_norm (a
                 gradient's squared norm without touching .grad, the buffers or the random streams)
    hessian      hessian_noise_scale: B_noise = tr(H Sigma) / (G^T H G) (HessianNoiseScale)

Inside training:

    tracker      NoiseScaleTracker: a user's own loop, observe(loss_fn, x, y) after backward, or record(...)
    microbatch   MicroBatchNoise, the loop callback (first micro-batch against the step's batch; history
                 noise_*_ema), and micro_batch_hooks
    device       the DDP communication hook (gradient_norms_hook, its state GradientNorms) and DeviceNoise,
                 the loop callback of a device group (history device_noise_*_ema)

Imports point one way: estimators and meter import nothing of bsresearch; exact, pairs and hessian the
measurement plumbing (measure.functional, losses); tracker the core; microbatch and device the loop. Names are
imported on first access, so `import bsresearch.noise` loads none of its modules; import from the modules
themselves inside bsresearch.
"""
from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this package that defines it
_WHERE = {
    "two_batch_estimate": "estimators", "micro_batch_estimate": "estimators", "NoiseScaleEMA": "estimators",
    "update_noise_ema": "estimators", "add_to_ema": "estimators", "noise_ema_columns": "estimators",
    "squared_grad_norm": "estimators",
    "NoiseMeter": "meter", "NoiseSample": "meter", "ESTIMATORS": "meter",
    "NoiseScale": "exact", "gradient_noise_scale": "exact", "per_example_gradients": "exact",
    "TwoBatchNoiseScale": "pairs", "two_batch_noise_scale": "pairs", "two_batch_pairs": "pairs",
    "two_batch_summary": "pairs", "small_batch_sq_norm": "pairs",
    "HessianNoiseScale": "hessian", "hessian_noise_scale": "hessian",
    "NoiseScaleTracker": "tracker",
    "MicroBatchNoise": "microbatch", "micro_batch_hooks": "microbatch",
    "GradientNorms": "device", "gradient_norms_hook": "device", "DeviceNoise": "device",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'bsresearch.noise' has no attribute {name!r}")


__all__ = list(_WHERE)
