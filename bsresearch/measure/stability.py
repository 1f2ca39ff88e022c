"""The curvature that training's stability is read against (Cohen et al. 2021, 2022; Andreyev and Beneventano
2024): the top Hessian eigenvalue (sharpness), its stability limit for the optimizer, the preconditioned
sharpness of Adam, and the batch sharpness of a mini-batch.

Unlike curvature.py, the loss is any closure over the live model (`loss()` returns the mean loss of some batch at
the model's current parameters, a 0-d tensor with its graph): a trainer's own loss of a dictionary batch (a
Hugging Face model's `.loss`, a LightningModule's training_step) needs no (x, y) split. Hessian-vector products
are by double backpropagation through one gradient graph, attention through ATTENTION_KERNEL (functional.
double_backward_attention). Every function leaves the model as found (functional.measuring: parameters,
buffers, modes, .grad) and writes no optimizer state; random start vectors come from `generator` only.

    sharpness:                 lambda_max(H)                       (2/lr is gradient descent's limit)
    preconditioned sharpness:  lambda_max(P^-1 H), P = diag(sqrt(v_hat) + eps) from Adam's state
                               (computed as lambda_max(P^-1/2 H P^-1/2), the same eigenvalues, symmetric)
    batch sharpness:           g_B^T H_B g_B / |g_B|^2, g_B and H_B the mini-batch's gradient and Hessian
    noise along the top:       the variance over mini-batches of g_B . u, u the full loss's top eigenvector
    limits:                    SGD 2/lr; heavy-ball momentum m (2 + 2m)/((1 - m) lr); Nesterov (2 + 2m)/((1 + 2m) lr);
                               Adam/AdamW (2 + 2 beta1)/((1 - beta1) lr), 38/lr at beta1 = 0.9
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .functional import ATTENTION_KERNEL, double_backward_attention, measuring
from .lanczos import lanczos

LossClosure = Callable[[], torch.Tensor]   # the mean loss at the model's current parameters, with its graph


def base_optimizer(optimizer: object) -> torch.optim.Optimizer | None:
    """The torch optimizer inside a framework's wrapper (accelerate's AcceleratedOptimizer `.optimizer`,
    Lightning's LightningOptimizer `._optimizer`), or None when there is none."""
    for _ in range(4):
        if type(optimizer).__name__ in ("AcceleratedOptimizer", "LightningOptimizer"):
            optimizer = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        else:
            break
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def is_adam(optimizer: torch.optim.Optimizer | None) -> bool:
    """Adam or AdamW (torch's, or a subclass): the optimizers whose preconditioned sharpness is measured."""
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))


def sharpness_limit(optimizer: object) -> float:
    """The stability limit of the quadratic model for the optimizer's first parameter group at its current lr
    (per unit of the loss's curvature, the same units as the sharpness): SGD 2/lr, heavy-ball momentum m
    (2 + 2m)/((1 - m) lr), Nesterov (2 + 2m)/((1 + 2m) lr), Adam/AdamW (2 + 2 beta1)/((1 - beta1) lr), the limit
    of its preconditioned sharpness. NaN for any other optimizer or lr = 0."""
    opt = base_optimizer(optimizer)
    if opt is None or not opt.param_groups:
        return math.nan
    group = opt.param_groups[0]
    lr = float(group["lr"])
    if lr <= 0:
        return math.nan
    if is_adam(opt):
        beta1 = float(group["betas"][0])
        return (2 + 2 * beta1) / ((1 - beta1) * lr)
    if isinstance(opt, torch.optim.SGD):
        m = float(group.get("momentum", 0.0))
        if group.get("nesterov", False):
            return (2 + 2 * m) / ((1 + 2 * m) * lr)
        return (2 + 2 * m) / ((1 - m) * lr)
    return math.nan


def adam_preconditioner(optimizer: object, params: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Adam's diagonal preconditioner P = sqrt(v / (1 - beta2^t)) + eps of each parameter (its next update
    divides by it; amsgrad: the running maximum of v), from the optimizer's state as it is now, or None before
    its first step or for another optimizer. Read only: the state is not written."""
    opt = base_optimizer(optimizer)
    if not is_adam(opt):
        return None
    assert opt is not None
    where = {id(p): group for group in opt.param_groups for p in group["params"]}
    out = []
    for p in params:
        state, group = opt.state.get(p), where.get(id(p))
        if not state or group is None or "exp_avg_sq" not in state:
            return None
        step = float(state["step"])
        amsgrad = group.get("amsgrad", False) and "max_exp_avg_sq" in state
        v = state["max_exp_avg_sq"] if amsgrad else state["exp_avg_sq"]
        v_hat = v.float() / (1 - float(group["betas"][1]) ** step)
        out.append(v_hat.sqrt() + float(group["eps"]))
    return out


class ClosureHessian:
    """Gradient and Hessian-vector products of loss() with respect to `params` (flat vectors, in their order),
    by double backpropagation through one gradient graph built here (its memory: the loss's activations and
    the first backward's intermediates, held until this object is dropped). Writes no .grad."""

    def __init__(self, loss: LossClosure, params: Sequence[torch.Tensor]) -> None:
        self.params = list(params)
        with double_backward_attention():
            value = loss()
            grads = torch.autograd.grad(value, self.params, create_graph=True, allow_unused=True)
        self.value = float(value.detach())
        self.grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, self.params)]
        self.n_products = 0

    def gradient(self) -> torch.Tensor:
        return torch.cat([g.detach().reshape(-1) for g in self.grads])

    def hvp(self, vector: torch.Tensor) -> torch.Tensor:
        """H v for a flat v (the params' total size)."""
        parts, start = [], 0
        for p in self.params:
            parts.append(vector[start:start + p.numel()].view_as(p).to(p.dtype))
            start += p.numel()
        live = [(g, p, v) for g, p, v in zip(self.grads, self.params, parts) if g.requires_grad]
        with double_backward_attention():
            out = torch.autograd.grad([g for g, _, _ in live], [p for _, p, _ in live], [v for _, _, v in live],
                                      retain_graph=True, allow_unused=True)
        by_param = {id(p): h for (_, p, _), h in zip(live, out) if h is not None}
        self.n_products += 1
        return torch.cat([by_param.get(id(p), torch.zeros_like(p)).reshape(-1).to(vector.dtype)
                          for p in self.params])


@dataclass(frozen=True)
class StabilityCurvature:
    """The curvature of a loss at the model's parameters: its top Hessian eigenvalue and, with an Adam
    optimizer in its state, the top eigenvalue of P^-1 H (NaN otherwise)."""
    sharpness: float
    sharpness_converged: bool
    preconditioned_sharpness: float
    preconditioned_converged: bool
    loss: float
    n_products: int                  # Hessian-vector products used (each about two backward passes)
    attention: str = ATTENTION_KERNEL
    vector: torch.Tensor | None = field(default=None, repr=False, compare=False)  # H's top unit eigenvector
    gradient: torch.Tensor | None = field(default=None, repr=False, compare=False)  # the loss's gradient, flat


def trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def stability_curvature(model: nn.Module, loss: LossClosure, optimizer: object = None, tol: float = 1e-3,
                        max_iter: int = 30, generator: torch.Generator | None = None,
                        bn_mode: str = "eval") -> StabilityCurvature:
    """lambda_max(H) of loss() by Lanczos and, for Adam/AdamW with state, lambda_max(P^-1 H) of the same Hessian
    (one gradient graph serves both), with relative residual tol (max_iter products each). The model is in
    eval mode unless bn_mode="train" and is left as found."""
    with measuring(model, bn_mode):
        params = trainable(model)
        hessian = ClosureHessian(loss, params)
        like = hessian.gradient()
        top = lanczos(hessian.hvp, like, 1, tol, max_iter, generator)
        precond = adam_preconditioner(optimizer, params)
        pre_value, pre_converged = math.nan, False
        if precond is not None:
            inv_sqrt = torch.cat([q.reshape(-1) for q in precond]).to(like.dtype).rsqrt()
            pre = lanczos(lambda v: inv_sqrt * hessian.hvp(inv_sqrt * v), like, 1, tol, max_iter, generator)
            pre_value, pre_converged = pre.eigenvalues[0], pre.converged
    return StabilityCurvature(top.eigenvalues[0], top.converged, pre_value, pre_converged, hessian.value,
                              hessian.n_products, vector=top.eigenvectors[0].detach(), gradient=like)


def batch_sharpness(model: nn.Module, loss: LossClosure) -> float:
    """g^T H g / |g|^2 for the gradient g and Hessian H of loss() (a mini-batch's loss as the trainer computed
    it, the model in the mode it is in; BatchNorm statistics restored): one Hessian-vector product. NaN for a
    zero gradient."""
    return batch_reading(model, loss).sharpness


@dataclass(frozen=True)
class BatchReading:
    """One mini-batch's g^T H g, |g|^2 and the gradient's component g . direction (NaN without a direction)."""
    curvature: float
    norm_sq: float
    along: float

    @property
    def sharpness(self) -> float:
        """g^T H g / |g|^2 (NaN for a zero gradient)."""
        return self.curvature / self.norm_sq if self.norm_sq else math.nan


def batch_reading(model: nn.Module, loss: LossClosure, direction: torch.Tensor | None = None) -> BatchReading:
    """loss()'s BatchReading from one gradient graph (no Hessian-vector product for a zero gradient)."""
    with measuring(model, "train" if model.training else "eval"):
        hessian = ClosureHessian(loss, trainable(model))
        g = hessian.gradient()
        along = float(g @ direction.to(g.dtype)) if direction is not None else math.nan
        norm_sq = float(g @ g)
        curvature = float(g @ hessian.hvp(g)) if norm_sq else 0.0
        return BatchReading(curvature, norm_sq, along)


def edge_of_stability(model: nn.Module, full_loss: LossClosure, batch_losses: Sequence[LossClosure],
                      optimizer: object = None, tol: float = 1e-3, max_iter: int = 30,
                      generator: torch.Generator | None = None) -> dict[str, float]:
    """What the edge of stochastic stability is read by (Andreyev and Beneventano 2024; Cohen et al. 2021,
    2022), at the model's current weights: `sharpness` (lambda_max of full_loss, its Lanczos convergence in
    `sharpness_converged`), `preconditioned_sharpness` (Adam/AdamW with state, else NaN), `sharpness_limit`
    (the optimizer's), `batch_sharpness` (the mean over batch_losses of each mini-batch's g^T H g / |g|^2),
    `batch_sharpness_pooled` (the ratio of their means, sum g^T H g / sum |g|^2: Andreyev and Beneventano's
    E[g^T H g] / E[|g|^2]),
    `noise_along_top` (the variance, over the same mini-batches, of their gradients' component along the full
    loss's top eigenvector; unbiased, NaN for fewer than 2) and `grad_along_top` (the full gradient's)."""
    curvature = stability_curvature(model, full_loss, optimizer, tol, max_iter, generator)
    u, g = curvature.vector, curvature.gradient
    full_along = float(g @ u.to(g.dtype)) if u is not None and g is not None else math.nan
    readings = [batch_reading(model, loss, u) for loss in batch_losses]
    sharp = [r.sharpness for r in readings if math.isfinite(r.sharpness)]
    along = [r.along for r in readings]
    norm_sq = sum(r.norm_sq for r in readings)
    n = len(along)
    mean_along = sum(along) / n if n else math.nan
    return {"sharpness": curvature.sharpness, "sharpness_converged": float(curvature.sharpness_converged),
            "preconditioned_sharpness": curvature.preconditioned_sharpness,
            "sharpness_limit": sharpness_limit(optimizer),
            "batch_sharpness": sum(sharp) / len(sharp) if sharp else math.nan,
            "batch_sharpness_pooled": sum(r.curvature for r in readings) / norm_sq if norm_sq else math.nan,
            "noise_along_top": sum((a - mean_along) ** 2 for a in along) / (n - 1) if n >= 2 else math.nan,
            "grad_along_top": full_along}
