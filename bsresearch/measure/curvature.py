"""Curvature of the mean loss: Hessian-vector products, top eigenvalues (Lanczos, power iteration),
Hutchinson trace, spectral density (stochastic Lanczos quadrature), and the same per layer.

The Hessian is that of the mean loss over all examples of `batches` (each batch's mean loss weighted
by its size), at the model's current parameters, with BatchNorm in eval mode unless bn_mode="train"
(then each batch is normalised with its own statistics, so the Hessian depends on the batching).
Vectors are flat, in the order of model.parameters(). Every function leaves the model as found and
draws its random vectors from `generator` only.

Cost: one backward pass per Hessian-vector product. The gradient graph is built once per call and
reused by every product while its saved tensors fit in `graph_budget_bytes` (default
functional.DEFAULT_GRAPH_BUDGET, 1 GiB); batches beyond it rebuild their graph per product (slower,
memory of one batch). graph_budget_bytes=0 always rebuilds.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .functional import ATTENTION_KERNEL, DEFAULT_GRAPH_BUDGET, Batches, LossFn, MeanLoss, layer_slices, measuring
from .lanczos import (
    Eigenpairs,
    SpectralDensity,
    TraceEstimate,
    hutchinson_trace,
    lanczos,
    power_iteration,
    stochastic_lanczos_quadrature,
)

__all__ = ["hvp", "top_eigenvalues", "hessian_trace", "spectral_density", "layer_curvature", "LayerCurvature",
           "Eigenpairs", "TraceEstimate", "SpectralDensity"]


def hvp(model: nn.Module, batches: Batches, vector: torch.Tensor, loss_fn: LossFn = F.cross_entropy,
        bn_mode: str = "eval", graph_budget_bytes: int = DEFAULT_GRAPH_BUDGET) -> torch.Tensor:
    """H v for a flat vector v (length = number of parameters); returns a flat vector on v's device."""
    with measuring(model, bn_mode):
        return MeanLoss(model, batches, loss_fn, graph_budget_bytes).hvp(vector)


def top_eigenvalues(model: nn.Module, batches: Batches, k: int = 1, method: str = "lanczos", tol: float = 1e-4,
                    max_iter: int | None = None, generator: torch.Generator | None = None,
                    loss_fn: LossFn = F.cross_entropy, bn_mode: str = "eval", which: str = "largest",
                    graph_budget_bytes: int = DEFAULT_GRAPH_BUDGET) -> Eigenpairs:
    """Top-k Hessian eigenvalues and unit eigenvectors (flat, (k, n_parameters)).

    method "lanczos" (full reorthogonalisation, max_iter default 100; which="largest" algebraic or
    "magnitude") or "power" (always largest magnitude, Hotelling deflation, max_iter default 1000 per
    eigenvalue). The result says how many Hessian-vector products were used and whether every relative
    residual reached `tol`.
    """
    with measuring(model, bn_mode):
        loss = MeanLoss(model, batches, loss_fn, graph_budget_bytes)
        if method == "lanczos":
            pairs = lanczos(loss.hvp, loss.point, k, tol, max_iter or 100, generator, which)
        elif method == "power":
            pairs = power_iteration(loss.hvp, loss.point, k, tol, max_iter or 1000, generator)
        else:
            raise ValueError(f"method must be lanczos or power; got {method!r}")
    return dataclasses.replace(pairs, bn_mode=bn_mode, attention=ATTENTION_KERNEL)


def hessian_trace(model: nn.Module, batches: Batches, n_probes: int = 20, generator: torch.Generator | None = None,
                  loss_fn: LossFn = F.cross_entropy, bn_mode: str = "eval",
                  graph_budget_bytes: int = DEFAULT_GRAPH_BUDGET) -> TraceEstimate:
    """Hutchinson estimate of tr(H) with Rademacher probes and its standard error (one product per probe)."""
    with measuring(model, bn_mode):
        loss = MeanLoss(model, batches, loss_fn, graph_budget_bytes)
        estimate = hutchinson_trace(loss.hvp, loss.point, n_probes, generator)
    return dataclasses.replace(estimate, bn_mode=bn_mode, attention=ATTENTION_KERNEL)


def spectral_density(model: nn.Module, batches: Batches, n_probes: int = 10, n_iter: int = 80,
                     generator: torch.Generator | None = None, reorthogonalize: bool = False,
                     loss_fn: LossFn = F.cross_entropy, bn_mode: str = "eval",
                     graph_budget_bytes: int = DEFAULT_GRAPH_BUDGET) -> SpectralDensity:
    """Hessian eigenvalue density by stochastic Lanczos quadrature (n_probes x n_iter products).

    Without reorthogonalisation, device memory beyond the model is three parameter-sized vectors.
    """
    with measuring(model, bn_mode):
        loss = MeanLoss(model, batches, loss_fn, graph_budget_bytes)
        density = stochastic_lanczos_quadrature(loss.hvp, loss.point, n_probes, n_iter, generator, reorthogonalize)
    return dataclasses.replace(density, bn_mode=bn_mode, attention=ATTENTION_KERNEL)


@dataclass(frozen=True)
class LayerCurvature:
    """Curvature of one layer's diagonal Hessian block (the other parameters held fixed)."""
    layer: str
    n_parameters: int
    top_eigenvalue: float
    top_eigenvalue_converged: bool
    trace: float
    trace_std_error: float
    n_products: int
    bn_mode: str
    attention: str = ATTENTION_KERNEL  # the attention kernel of its Hessian-vector products


def layer_curvature(model: nn.Module, batches: Batches, n_probes: int = 20, tol: float = 1e-4,
                    max_iter: int = 100, generator: torch.Generator | None = None,
                    loss_fn: LossFn = F.cross_entropy, bn_mode: str = "eval",
                    graph_budget_bytes: int = DEFAULT_GRAPH_BUDGET) -> dict[str, LayerCurvature]:
    """Top eigenvalue (Lanczos) and Hutchinson trace of each layer's diagonal Hessian block.

    Layers are modules owning parameters ('0' for '0.weight' and '0.bias'). A block product costs a
    full Hessian-vector product (the vector is zero outside the block); one gradient graph serves every
    layer. Attention runs through ATTENTION_KERNEL (functional.double_backward_attention).
    """
    out = {}
    with measuring(model, bn_mode):
        loss = MeanLoss(model, batches, loss_fn, graph_budget_bytes)
        for layer, part in layer_slices(model).items():
            def block_hvp(v: torch.Tensor, part: slice = part) -> torch.Tensor:
                full = torch.zeros_like(loss.point)
                full[part] = v
                return loss.hvp(full)[part]
            like = loss.point[part]
            pairs = lanczos(block_hvp, like, 1, tol, max_iter, generator)
            trace = hutchinson_trace(block_hvp, like, n_probes, generator)
            out[layer] = LayerCurvature(layer, like.numel(), pairs.eigenvalues[0], pairs.converged, trace.trace,
                                        trace.std_error, pairs.n_products + trace.n_products, bn_mode)
    return out
