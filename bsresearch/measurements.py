"""The measurements a run can take after training (`RunConfig.measure`), merged into metrics.json: the registry
MEASUREMENTS (name -> function) over bsresearch.measure and bsresearch.noise, and take_measurements.

Each entry is `(model, data, cfg, generator, loss) -> dict` of JSON-able numbers. All use the whole
training set, the run's loss (the mean cross-entropy unless the config names another, built in or the
user's), fp32 and eval-mode BatchNorm, and draw from the run's probe generator. The exact noise scale needs
per-example gradients (torch.func.vmap); for a model vmap cannot take, the two-batch estimator stands in and
`noise_method` says which ran (`noise_fallback` why).
Defaults are chosen so each costs a few seconds at most for the MNIST-1D CNN (5.2k parameters, 4000
examples) on one CPU thread; docs/measurements.md#cost lists the measured costs.
"""
from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from .config import RunConfig
from .data import Dataset
from .losses import Loss, loss_for
from .measure import curvature, sharpness
from .measure.functional import batches_of
from .noise.exact import gradient_noise_scale
from .noise.hessian import hessian_noise_scale
from .noise.pairs import two_batch_noise_scale

NOISE_HESSIAN_PROBES = 10          # Hutchinson probes for tr(H Sigma) in B_noise
HESSIAN_TOL = 1e-3                 # relative residual of the top eigenvalue (Lanczos)
HESSIAN_TRACE_PROBES = 10          # Hutchinson probes for tr(H)
KESKAR_EPS = (1e-3, 5e-4)          # Keskar et al.'s two box sizes, full space, 10 L-BFGS-B iterations
WORST_RHO, AVERAGE_SIGMA = 0.05, 0.01                    # L2 ball radius (SAM's default) and Gaussian std
ADAPTIVE_WORST_RHO, ADAPTIVE_AVERAGE_SIGMA = 0.5, 0.05   # the same for perturbations scaled by |w|
SHARPNESS_SAMPLES = 10
# m-sharpness: worst case per batch of M examples, averaged over M_BATCHES disjoint random batches (2048
# examples: its cost is then that of a few full-data ascents). Small m is the variant Andriushchenko et al.
# (2023) found to track generalization best, especially adaptive.
M_SHARPNESS_M, M_BATCHES = 128, 16
TWO_BATCH_SIZES, TWO_BATCH_DRAWS = (32, 256), 40   # the noise scale where vmap cannot take the model
VMAP_FAILURES = (RuntimeError, NotImplementedError, TypeError, ValueError)


def measure_noise_scale(model: nn.Module, data: Dataset, cfg: RunConfig, generator: torch.Generator,
                        loss: Loss) -> dict[str, Any]:
    """Exact B_simple over the training set (the population SGD samples from: no sample correction, so
    no sampling error either) and B_noise = tr(H Sigma)/(G^T H G) with its Hutchinson standard error. Where
    vmap cannot take the model: the two-batch B_simple (TWO_BATCH_SIZES, TWO_BATCH_DRAWS draws with
    replacement) and no B_noise. Where the model has no double backward (Hessian-vector products): B_simple,
    and why B_noise is missing (noise_b_noise_error). Attention in the Hessian-vector products runs through
    torch's math kernel (noise_b_noise_attention_kernel), which has a double backward."""
    x, y = data.x_train, data.y_train
    try:
        exact = gradient_noise_scale(model, x, y, unbiased=False, loss_fn=loss)
    except VMAP_FAILURES as exc:
        b_small, b_big = TWO_BATCH_SIZES
        b_big = min(b_big, len(x))
        two = two_batch_noise_scale(model, x, y, min(b_small, b_big // 2), b_big, TWO_BATCH_DRAWS,
                                    generator=generator, loss_fn=loss)
        return {"noise_b_simple": two.b_simple, "noise_trace_cov": two.trace_cov,
                "noise_grad_sq_norm": two.grad_sq_norm, "noise_method": "two_batch",
                "noise_fallback": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    out = {"noise_b_simple": exact.b_simple, "noise_trace_cov": exact.trace_cov,
           "noise_grad_sq_norm": exact.grad_sq_norm, "noise_method": "exact_per_example",
           "noise_n_examples": exact.n_examples}
    try:   # Hessian-vector products need double backward, which some operations lack (CPU flash attention)
        with_hessian = hessian_noise_scale(model, x, y, n_probes=NOISE_HESSIAN_PROBES, generator=generator,
                                           loss_fn=loss)
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        return {**out, "noise_b_noise_error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {**out, "noise_b_noise": with_hessian.b_noise, "noise_b_noise_std_error": with_hessian.b_noise_std_error,
            "noise_b_noise_attention_kernel": with_hessian.attention}


def measure_hessian(model: nn.Module, data: Dataset, cfg: RunConfig, generator: torch.Generator,
                    loss: Loss) -> dict[str, Any]:
    """Top Hessian eigenvalue (Lanczos) and Hutchinson trace of the training loss."""
    batches = batches_of(data.x_train, data.y_train)
    top = curvature.top_eigenvalues(model, batches, k=1, tol=HESSIAN_TOL, max_iter=50, generator=generator,
                                    loss_fn=loss)
    trace = curvature.hessian_trace(model, batches, n_probes=HESSIAN_TRACE_PROBES, generator=generator, loss_fn=loss)
    return {"hessian_top_eigenvalue": top.eigenvalues[0], "hessian_top_eigenvalue_residual": top.residuals[0],
            "hessian_top_eigenvalue_converged": top.converged, "hessian_trace": trace.trace,
            "hessian_trace_std_error": trace.std_error, "hessian_products": top.n_products + trace.n_products,
            "hessian_attention_kernel": top.attention}


def measure_keskar_sharpness(model: nn.Module, data: Dataset, cfg: RunConfig, generator: torch.Generator,
                             loss: Loss) -> dict[str, Any]:
    """Keskar et al.'s phi (percent) at eps 1e-3 and 5e-4, full space, on the full training loss."""
    out: dict[str, Any] = {}
    for eps in KESKAR_EPS:
        result = sharpness.keskar_sharpness(model, data.x_train, data.y_train, eps, generator=generator, loss_fn=loss)
        out["keskar_loss"] = result.loss
        out[f"keskar_phi_eps{eps:.0e}".replace("e-0", "e-")] = result.phi
        out[f"keskar_loss_at_max_eps{eps:.0e}".replace("e-0", "e-")] = result.loss_at_max
    return out


def measure_sharpness(model: nn.Module, data: Dataset, cfg: RunConfig, generator: torch.Generator,
                      loss: Loss) -> dict[str, Any]:
    """Worst-case (L2 ball) and average-case (Gaussian) sharpness, plain and adaptive, on the training loss."""
    x, y = data.x_train, data.y_train
    worst = sharpness.worst_case_sharpness(model, x, y, WORST_RHO, loss_fn=loss)
    average = sharpness.average_case_sharpness(model, x, y, AVERAGE_SIGMA, SHARPNESS_SAMPLES, generator=generator,
                                               loss_fn=loss)
    a_worst = sharpness.worst_case_sharpness(model, x, y, ADAPTIVE_WORST_RHO, adaptive=True, loss_fn=loss)
    a_average = sharpness.average_case_sharpness(model, x, y, ADAPTIVE_AVERAGE_SIGMA, SHARPNESS_SAMPLES,
                                                 adaptive=True, generator=generator, loss_fn=loss)
    return {f"sharpness_worst_rho{WORST_RHO:g}": worst.sharpness,
            f"sharpness_average_sigma{AVERAGE_SIGMA:g}": average.sharpness,
            f"sharpness_average_sigma{AVERAGE_SIGMA:g}_std_error": average.std_error,
            f"sharpness_adaptive_worst_rho{ADAPTIVE_WORST_RHO:g}": a_worst.sharpness,
            f"sharpness_adaptive_average_sigma{ADAPTIVE_AVERAGE_SIGMA:g}": a_average.sharpness,
            f"sharpness_adaptive_average_sigma{ADAPTIVE_AVERAGE_SIGMA:g}_std_error": a_average.std_error}


def measure_m_sharpness(model: nn.Module, data: Dataset, cfg: RunConfig, generator: torch.Generator,
                        loss: Loss) -> dict[str, Any]:
    """m-sharpness (worst case per batch of m, averaged), plain and adaptive, on the training loss."""
    x, y = data.x_train, data.y_train
    plain = sharpness.m_sharpness(model, x, y, WORST_RHO, M_SHARPNESS_M, M_BATCHES, generator=generator, loss_fn=loss)
    adaptive = sharpness.m_sharpness(model, x, y, ADAPTIVE_WORST_RHO, M_SHARPNESS_M, M_BATCHES, adaptive=True,
                                     generator=generator, loss_fn=loss)
    return {f"m_sharpness_m{M_SHARPNESS_M}_rho{WORST_RHO:g}": plain.sharpness,
            f"m_sharpness_adaptive_m{M_SHARPNESS_M}_rho{ADAPTIVE_WORST_RHO:g}": adaptive.sharpness}


# name -> function(model, data, cfg, generator, loss) -> dict of JSON-able numbers, merged into metrics.json.
# The names must equal config.MEASUREMENTS (a test checks).
MEASUREMENTS: dict[str, Callable[[nn.Module, Dataset, RunConfig, torch.Generator, Loss], dict[str, Any]]] = {
    "noise_scale": measure_noise_scale,
    "hessian": measure_hessian,
    "keskar_sharpness": measure_keskar_sharpness,
    "sharpness": measure_sharpness,
    "m_sharpness": measure_m_sharpness,
}


def take_measurements(names: tuple[str, ...], model: nn.Module, data: Dataset, cfg: RunConfig,
                      generator: torch.Generator, loss: Loss | None = None) -> dict[str, Any]:
    """Run the named measurements with the run's loss (cfg.loss unless given); one that fails is recorded
    under 'measurement_errors', not raised, so a finished training run is never lost to a measurement."""
    loss = loss or loss_for(cfg.loss)
    if cfg.measure_train_size:   # the first examples only: the same subset for every run
        n = cfg.measure_train_size
        data = dataclasses.replace(data, x_train=data.x_train[:n], y_train=data.y_train[:n])
    out: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for name in names:
        try:
            out.update(MEASUREMENTS[name](model, data, cfg, generator, loss))
        except Exception:  # noqa: BLE001
            errors[name] = traceback.format_exc(limit=3)
    if errors:
        out["measurement_errors"] = errors
    return out
