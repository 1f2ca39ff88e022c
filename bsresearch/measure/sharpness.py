"""Sharpness: Keskar et al.'s epsilon-sharpness, worst-case (L2 ball) and average-case (Gaussian)
sharpness, their adaptive (|w|-scaled) variants, and m-sharpness.

The loss is the mean loss over all of (x, y) (the full training loss when given the training set),
BatchNorm in eval mode unless bn_mode="train". Parameters are perturbed as one flat vector in
model.parameters() order; buffers are not perturbed. The model is left as found; random draws come
from `generator` only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .functional import DEFAULT_CHUNK, LossFn, MeanLoss, batches_of, generator_or_default, measuring, normal_like


# ----------------------------------------------------------------------------- Keskar et al. 2017
@dataclass(frozen=True)
class KeskarSharpness:
    """phi(x, eps, A) = (max_{y in C} f(x + A y) - f(x)) / (1 + f(x)) * 100, C the box
    |y_i| <= eps (|(A^+ x)_i| + 1); A = identity (full space) or a random n x p normal matrix."""
    phi: float                  # percent
    eps: float
    loss: float                 # f(x): mean loss at the model's parameters
    loss_at_max: float          # f(x + A y*) at the best point found
    subspace_dim: int | None    # p, or None for the full space
    maximiser: np.ndarray       # y* (n_parameters or p entries), float64
    box: np.ndarray             # the half-widths eps (|(A^+ x)_i| + 1) of C
    n_iterations: int           # L-BFGS-B iterations
    n_evaluations: int          # loss-and-gradient evaluations (each a pass over all examples)
    n_examples: int
    bn_mode: str


@dataclass
class _Best:
    """The highest loss L-BFGS-B has evaluated so far, where, and L at the start (y = 0)."""
    loss: float
    y: np.ndarray
    f0: float | None = None


def keskar_sharpness(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float,
                     subspace_dim: int | None = None, generator: torch.Generator | None = None,
                     max_iter: int = 10, chunk_size: int = DEFAULT_CHUNK, loss_fn: LossFn = F.cross_entropy,
                     bn_mode: str = "eval") -> KeskarSharpness:
    """Keskar et al.'s epsilon-sharpness, maximised from y = 0 with scipy's bounded L-BFGS-B
    (max_iter iterations) on the mean loss over all of (x, y), with its exact gradient.

    The reported maximum is the largest loss at any point evaluated (y = 0 included), so phi >= 0 and
    the maximiser lies in the box. subspace_dim = p draws A from `generator` (default: seeded 0).
    """
    from scipy import optimize  # not at the top: it would add ~1 s to every run's start
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0; got {eps!r}")
    with measuring(model, bn_mode):
        loss = MeanLoss(model, batches_of(x, y, chunk_size), loss_fn)
        x0 = loss.point
        if subspace_dim is None:
            matrix, coords = None, x0
        else:
            matrix = normal_like(x0, generator_or_default(generator), (x0.numel(), subspace_dim))
            coords = torch.linalg.pinv(matrix.double()) @ x0.double()
        box = eps * (coords.double().abs().cpu().numpy() + 1.0)
        best = _Best(loss=-math.inf, y=np.zeros_like(box))

        def negative_loss(yv: np.ndarray) -> tuple[float, np.ndarray]:
            step = torch.tensor(yv, dtype=x0.dtype, device=x0.device)
            value, grad = loss.value_and_grad(x0 + (matrix @ step if matrix is not None else step))
            value = float(value)
            if matrix is not None:
                grad = matrix.T @ grad
            if best.f0 is None:  # L-BFGS-B evaluates y = 0 first: L(w) itself
                best.f0 = value
            if value > best.loss:
                best.loss, best.y = value, yv.copy()
            return -value, -grad.double().cpu().numpy()

        result = optimize.minimize(negative_loss, np.zeros_like(box), jac=True, method="L-BFGS-B",
                                   bounds=optimize.Bounds(-box, box),
                                   # start at a near-stationary point: do not stop on a tiny gradient
                                   options={"maxiter": max_iter, "gtol": 1e-12, "ftol": 1e-15})
    f0 = best.f0
    assert f0 is not None
    phi = (best.loss - f0) / (1 + f0) * 100
    return KeskarSharpness(phi, eps, f0, best.loss, subspace_dim, best.y, box, int(result.get("nit", 0)),
                           loss.n_gradients, loss.n_examples, bn_mode)


# ----------------------------------------------------------------------------- worst and average case
@dataclass(frozen=True)
class Sharpness:
    """L(w + delta) - L(w) for a perturbation delta of a given size (mean loss, eval-mode BatchNorm).

    worst_case: the largest increase found in the ball |delta| <= radius (projected normalised
    gradient ascent); average_case: the mean increase for delta ~ N(0, radius^2 I); m_sharpness: the
    worst case per batch of m examples (loss on that batch), averaged over batches. Adaptive: delta =
    |w| * e with e in the ball (or Gaussian), which is invariant to rescaling ReLU layers.
    """
    kind: str                   # worst_case | average_case | m_sharpness
    adaptive: bool
    radius: float               # rho (L2 radius) or sigma (standard deviation)
    sharpness: float            # mean over samples/batches of L(w + delta) - L(w)
    loss: float                 # L(w) (m_sharpness: mean over batches)
    perturbed_loss: float       # L(w + delta)
    std_error: float            # over samples or batches; NaN for a single worst case
    n_evaluations: int          # loss or gradient passes over the data
    m: int | None
    n_examples: int
    bn_mode: str


def _ascent(loss: MeanLoss, rho: float, n_steps: int, scale: torch.Tensor | None) -> tuple[float, float]:
    """(L(w), max L found in the ball) by n_steps of projected normalised gradient ascent of size 2 rho / n_steps
    in e-space, delta = scale * e (scale None: delta = e). One step is SAM's perturbation rho g/|g|."""
    w0 = loss.point
    e = torch.zeros_like(w0)
    f0 = best = float(loss.value())
    for _ in range(n_steps):
        value, g = loss.value_and_grad(w0 + (scale * e if scale is not None else e))
        best = max(best, float(value))
        if scale is not None:
            g = g * scale
        norm = g.norm()
        if norm == 0:
            break
        e = e + (2 * rho / n_steps) * g / norm
        e = e * min(1.0, rho / float(e.norm()))
    best = max(best, float(loss.value(w0 + (scale * e if scale is not None else e))))
    return f0, best


def worst_case_sharpness(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rho: float, n_steps: int = 5,
                         adaptive: bool = False, chunk_size: int = DEFAULT_CHUNK,
                         loss_fn: LossFn = F.cross_entropy, bn_mode: str = "eval") -> Sharpness:
    """max_{|e| <= rho} L(w + delta(e)) - L(w) over all of (x, y), delta = e or |w| * e (adaptive)."""
    with measuring(model, bn_mode):
        loss = MeanLoss(model, batches_of(x, y, chunk_size), loss_fn)
        f0, best = _ascent(loss, rho, n_steps, loss.point.abs() if adaptive else None)
    return Sharpness("worst_case", adaptive, rho, best - f0, f0, best, math.nan,
                     loss.n_gradients + 2, None, loss.n_examples, bn_mode)


def average_case_sharpness(model: nn.Module, x: torch.Tensor, y: torch.Tensor, sigma: float, n_samples: int = 10,
                           adaptive: bool = False, generator: torch.Generator | None = None,
                           chunk_size: int = DEFAULT_CHUNK, loss_fn: LossFn = F.cross_entropy,
                           bn_mode: str = "eval") -> Sharpness:
    """E_z L(w + sigma z) - L(w), z ~ N(0, I) (adaptive: sigma |w| z), over n_samples draws from `generator`."""
    if n_samples < 2:
        raise ValueError(f"n_samples must be at least 2 (for a standard error); got {n_samples}")
    generator = generator_or_default(generator)
    with measuring(model, bn_mode):
        loss = MeanLoss(model, batches_of(x, y, chunk_size), loss_fn)
        w0 = loss.point
        scale = sigma * (w0.abs() if adaptive else torch.ones_like(w0))
        f0 = float(loss.value())
        values = np.array([float(loss.value(w0 + scale * normal_like(w0, generator))) for _ in range(n_samples)])
    increase = values - f0
    return Sharpness("average_case", adaptive, sigma, float(increase.mean()), f0, float(values.mean()),
                     float(increase.std(ddof=1) / math.sqrt(n_samples)), n_samples + 1, None, len(x), bn_mode)


def m_sharpness(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rho: float, m: int, n_batches: int | None = None,
                n_steps: int = 5, adaptive: bool = False, generator: torch.Generator | None = None,
                loss_fn: LossFn = F.cross_entropy, bn_mode: str = "eval") -> Sharpness:
    """Worst-case sharpness of each of n_batches random disjoint batches of m examples (each with its own
    perturbation and its own loss), averaged (Foret et al. 2021; Andriushchenko et al. 2023)."""
    n_available = len(x) // m
    if m < 1 or n_available < 1:
        raise ValueError(f"m must be between 1 and the {len(x)} examples; got {m}")
    n_batches = min(n_batches or n_available, n_available)
    generator = generator_or_default(generator)
    order = torch.randperm(len(x), generator=generator, device=generator.device).to(x.device)
    f0s, bests, evaluations = [], [], 0
    with measuring(model, bn_mode):
        for i in range(n_batches):
            idx = order[i * m:(i + 1) * m]
            loss = MeanLoss(model, [(x[idx], y[idx])], loss_fn)
            f0, best = _ascent(loss, rho, n_steps, loss.point.abs() if adaptive else None)
            f0s.append(f0)
            bests.append(best)
            evaluations += loss.n_gradients + 2
    increase = np.array(bests) - np.array(f0s)
    std_error = float(increase.std(ddof=1) / math.sqrt(n_batches)) if n_batches > 1 else math.nan
    return Sharpness("m_sharpness", adaptive, rho, float(increase.mean()), float(np.mean(f0s)), float(np.mean(bests)),
                     std_error, evaluations, m, n_batches * m, bn_mode)
