"""Eigenvalues, traces and spectral densities of a symmetric operator known only through products v -> A v.

Pure linear algebra on a `matvec` callable (flat float vectors on any device); curvature.py applies it
to Hessians. Every routine counts the products it used and says whether it met its tolerance.
Tolerances are relative residuals |A u - theta u| / |theta|: a residual r certifies that an eigenvalue
of A lies within r of theta, so tol = 1e-4 guarantees a relative eigenvalue error of at most 1e-4.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .functional import normal_like, rademacher_like

MatVec = Callable[[torch.Tensor], torch.Tensor]
WHICH = ("largest", "magnitude")


@dataclass(frozen=True)
class Eigenpairs:
    """Top-k eigenvalues (descending by the `which` order) and unit eigenvectors of a symmetric operator."""
    eigenvalues: tuple[float, ...]
    eigenvectors: torch.Tensor          # (k, dim), unit rows, on the operator's device
    residuals: tuple[float, ...]        # |A u - theta u| / |theta| for each pair
    n_products: int                     # matrix-vector (Hessian-vector) products used
    converged: bool                     # every residual <= tol
    tol: float
    method: str                         # "lanczos" or "power"
    bn_mode: str = "eval"
    attention: str | None = None  # the attention kernel of its Hessian-vector products (functional.ATTENTION_KERNEL)


def _ritz(alphas: list[float], betas: list[float], k: int, which: str) -> tuple[np.ndarray, np.ndarray]:
    """Ritz values (the k wanted, ordered) and the matching eigenvectors of the tridiagonal T."""
    t = np.diag(alphas) + np.diag(betas[:len(alphas) - 1], 1) + np.diag(betas[:len(alphas) - 1], -1)
    theta, s = np.linalg.eigh(t)
    order = np.argsort(-theta if which == "largest" else -np.abs(theta))[:k]
    return theta[order], s[:, order]


def lanczos(matvec: MatVec, like: torch.Tensor, k: int = 1, tol: float = 1e-5, max_iter: int = 100,
            generator: torch.Generator | None = None, which: str = "largest") -> Eigenpairs:
    """Top-k eigenpairs by Lanczos with full reorthogonalisation.

    like: a vector with the operator's dimension, dtype and device (the start vector is random normal
    from `generator`). which: "largest" (algebraic) or "magnitude". Stops when every wanted Ritz pair's
    relative residual is <= tol, when the Krylov space is exhausted (exact), or after max_iter products.
    Memory: the Krylov basis, (iterations x dim) on like's device.
    """
    if which not in WHICH:
        raise ValueError(f"which must be one of {', '.join(WHICH)}; got {which!r}")
    dim = like.numel()
    if not 1 <= k <= dim:
        raise ValueError(f"k must be between 1 and the dimension {dim}; got {k}")
    q = normal_like(like, generator or torch.Generator().manual_seed(0), (dim,))
    basis = [q / q.norm()]
    alphas: list[float] = []
    betas: list[float] = []
    theta, s, converged, residuals = np.zeros(0), np.zeros((0, 0)), False, np.full(k, np.inf)
    for j in range(min(max_iter, dim)):
        w = matvec(basis[j])
        alphas.append(float(w @ basis[j]))
        q_basis = torch.stack(basis)
        for _ in range(2):  # "twice is enough" (Kahan-Parlett): keeps the basis orthogonal to working precision
            w = w - q_basis.T @ (q_basis @ w)
        beta = float(w.norm())
        betas.append(beta)
        exhausted = beta <= 1e-10 * max(np.abs(alphas).max(), 1e-30)  # an invariant subspace: T is exact
        if len(alphas) >= k:
            theta, s = _ritz(alphas, betas, k, which)
            residuals = beta * np.abs(s[-1]) / np.maximum(np.abs(theta), 1e-30)
            converged = bool(np.all(residuals <= tol)) or exhausted
            if converged:
                break
        elif exhausted:
            raise ValueError(f"the Krylov space closed after {len(alphas)} products, fewer than k={k}: "
                             f"the operator has fewer distinct eigenvalues along the start vector")
        basis.append(w / beta)
    if len(alphas) < k:
        raise ValueError(f"only {len(alphas)} Lanczos iterations for k={k}: raise max_iter")
    q_basis = torch.stack(basis[:len(alphas)])
    vectors = torch.as_tensor(s.T, dtype=like.dtype, device=like.device) @ q_basis
    vectors = vectors / vectors.norm(dim=1, keepdim=True)
    return Eigenpairs(tuple(float(t) for t in theta), vectors, tuple(float(r) for r in residuals),
                      len(alphas), converged, tol, "lanczos")


def power_iteration(matvec: MatVec, like: torch.Tensor, k: int = 1, tol: float = 1e-5, max_iter: int = 1000,
                    generator: torch.Generator | None = None) -> Eigenpairs:
    """Top-k eigenpairs by magnitude, by power iteration with Hotelling deflation (for comparison).

    Eigenvalue i is found on A - sum_{j<i} theta_j u_j u_j^T; each stops at relative residual <= tol or
    after max_iter products (each) and `converged` says whether all did.
    """
    dim = like.numel()
    if not 1 <= k <= dim:
        raise ValueError(f"k must be between 1 and the dimension {dim}; got {k}")
    generator = generator or torch.Generator().manual_seed(0)
    values: list[float] = []
    vectors: list[torch.Tensor] = []
    residuals: list[float] = []
    n_products = 0
    for _ in range(k):
        v = normal_like(like, generator, (dim,))
        v = v / v.norm()
        theta, residual = 0.0, math.inf
        for _ in range(max_iter):
            w = matvec(v)
            n_products += 1
            for value, u in zip(values, vectors):
                w = w - value * (u @ v) * u
            theta = float(w @ v)
            residual = float((w - theta * v).norm()) / max(abs(theta), 1e-30)
            if residual <= tol:
                break
            v = w / w.norm()
        values.append(theta)
        vectors.append(v)
        residuals.append(residual)
    return Eigenpairs(tuple(values), torch.stack(vectors), tuple(residuals), n_products,
                      all(r <= tol for r in residuals), tol, "power")


@dataclass(frozen=True)
class TraceEstimate:
    """Hutchinson estimate of tr(A) with Rademacher probes: mean of z^T A z and its standard error."""
    trace: float
    std_error: float                    # sample std of z^T A z / sqrt(n_probes)
    n_probes: int
    n_products: int
    bn_mode: str = "eval"
    attention: str | None = None  # the attention kernel of its Hessian-vector products (functional.ATTENTION_KERNEL)


def hutchinson_trace(matvec: MatVec, like: torch.Tensor, n_probes: int = 20,
                     generator: torch.Generator | None = None) -> TraceEstimate:
    """tr(A) ~ mean over Rademacher z of z^T A z (unbiased); needs n_probes >= 2 for the error bar."""
    if n_probes < 2:
        raise ValueError(f"n_probes must be at least 2 (for a standard error); got {n_probes}")
    generator = generator or torch.Generator().manual_seed(0)
    samples = []
    for _ in range(n_probes):
        z = rademacher_like(like, generator, (like.numel(),))
        samples.append(float(z @ matvec(z)))
    values = np.array(samples)
    return TraceEstimate(float(values.mean()), float(values.std(ddof=1) / math.sqrt(n_probes)), n_probes, n_probes)


@dataclass(frozen=True)
class SpectralDensity:
    """Stochastic Lanczos quadrature: for each probe, nodes (Ritz values) and Gauss weights.

    The density is the average over probes of sum_j weights[p, j] * delta(lambda - nodes[p, j]); its mass
    is 1 and its mean is tr(A)/dim (in expectation). Unused slots (early breakdown) have weight 0.
    """
    nodes: np.ndarray                   # (n_probes, n_iter)
    weights: np.ndarray                 # (n_probes, n_iter), each row sums to 1
    dim: int
    n_products: int
    bn_mode: str = "eval"
    attention: str | None = None  # the attention kernel of its Hessian-vector products (functional.ATTENTION_KERNEL)

    def mass(self) -> float:
        return float(self.weights.sum(1).mean())

    def moment(self, order: int) -> float:
        """Estimate of tr(A^order) / dim."""
        return float((self.weights * self.nodes ** order).sum(1).mean())

    def moment_std_error(self, order: int) -> float:
        """Standard error of `moment(order)` from the spread over probes (needs n_probes >= 2)."""
        per_probe = (self.weights * self.nodes ** order).sum(1)
        return float(per_probe.std(ddof=1) / math.sqrt(len(per_probe)))

    def density(self, grid: np.ndarray, sigma: float) -> np.ndarray:
        """Gaussian-smoothed density on `grid` (integrates to the mass over a wide enough grid)."""
        grid = np.asarray(grid, dtype=float)[:, None, None]
        kernel = np.exp(-0.5 * ((grid - self.nodes[None]) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
        return (kernel * self.weights[None]).sum(2).mean(1)


def _lanczos_tridiagonal(matvec: MatVec, v: torch.Tensor, n_iter: int,
                         reorthogonalize: bool) -> tuple[list[float], list[float]]:
    """Alphas and betas of n_iter Lanczos steps from unit v. Without reorthogonalisation only three
    vectors live on the device; with it, the whole basis."""
    alphas: list[float] = []
    betas: list[float] = []
    basis = [v] if reorthogonalize else []
    previous, current, beta = torch.zeros_like(v), v, 0.0
    for _ in range(n_iter):
        w = matvec(current)
        alpha = float(w @ current)
        w = w - alpha * current - beta * previous
        if reorthogonalize:
            q_basis = torch.stack(basis)
            for _ in range(2):
                w = w - q_basis.T @ (q_basis @ w)
        alphas.append(alpha)
        beta = float(w.norm())
        if beta <= 1e-10 * max(abs(a) for a in alphas) or len(alphas) == v.numel():
            break
        betas.append(beta)
        previous, current = current, w / beta
        if reorthogonalize:
            basis.append(current)
    return alphas, betas


def stochastic_lanczos_quadrature(matvec: MatVec, like: torch.Tensor, n_probes: int = 10, n_iter: int = 80,
                                  generator: torch.Generator | None = None,
                                  reorthogonalize: bool = False) -> SpectralDensity:
    """Spectral density by stochastic Lanczos quadrature (Ghorbani et al. 2019, Papyan 2019).

    Each probe is a normalised Rademacher vector; n_iter Lanczos steps give a tridiagonal T whose
    eigenvalues are the nodes and whose eigenvectors' squared first components are the weights.
    Without reorthogonalisation (the default) device memory is three vectors; Gauss quadrature stays
    accurate for the density even as orthogonality is lost (spurious copies of converged eigenvalues
    share its weight).
    """
    generator = generator or torch.Generator().manual_seed(0)
    dim = like.numel()
    nodes = np.zeros((n_probes, n_iter))
    weights = np.zeros((n_probes, n_iter))
    n_products = 0
    for p in range(n_probes):
        v = rademacher_like(like, generator, (dim,)) / math.sqrt(dim)
        alphas, betas = _lanczos_tridiagonal(matvec, v, min(n_iter, dim), reorthogonalize)
        n_products += len(alphas)
        t = np.diag(alphas) + np.diag(betas[:len(alphas) - 1], 1) + np.diag(betas[:len(alphas) - 1], -1)
        theta, s = np.linalg.eigh(t)
        nodes[p, :len(theta)] = theta
        weights[p, :len(theta)] = s[0] ** 2
    return SpectralDensity(nodes, weights, dim, n_products)
