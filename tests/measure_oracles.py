"""Brute-force oracles and tiny problems shared by the tests of bsresearch.measure (test_measure_*.py)."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

from bsresearch.measure.functional import flatten, unflatten


def tiny_mlp(seed: int = 0, n: int = 64, dim: int = 5, hidden: int = 8, classes: int = 3, batchnorm: bool = False,
             train_steps: int = 100, dtype: torch.dtype = torch.float32):
    """A small ReLU MLP (75 parameters without BatchNorm) trained a little on teacher-labelled Gaussian
    inputs: (model, x, y)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=dtype)
    teacher = torch.randn(dim, classes, generator=g, dtype=dtype)
    y = (x @ teacher + 0.5 * torch.randn(n, classes, generator=g, dtype=dtype)).argmax(1)  # learnable, a little noisy
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # nn.Linear's default init draws from the global RNG: restore it afterwards
    layers = [nn.Linear(dim, hidden)] + ([nn.BatchNorm1d(hidden)] if batchnorm else []) + [nn.ReLU(),
                                                                                           nn.Linear(hidden, classes)]
    model = nn.Sequential(*layers).to(dtype)
    torch.random.set_rng_state(torch_state)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    for _ in range(train_steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    model.zero_grad(set_to_none=True)
    return model, x, y


def flat_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, train_mode: bool = False):
    """(f, point): f(flat parameters) = mean cross-entropy of a float64 copy of the model (train or eval
    mode, buffers fixed), and the model's flat parameters in float64."""
    clone = copy.deepcopy(model).double().train(train_mode)
    like = {n: p.detach() for n, p in clone.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in clone.named_buffers()}

    def f(flat: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(clone, {**unflatten(flat, like), **buffers}, (x.double(),)), y)
    return f, flatten(like)


def dense_hessian(model: nn.Module, x: torch.Tensor, y: torch.Tensor, train_mode: bool = False) -> torch.Tensor:
    """The exact Hessian of the mean cross-entropy, float64, by torch.autograd.functional.hessian."""
    f, point = flat_loss(model, x, y, train_mode)
    return torch.autograd.functional.hessian(f, point, vectorize=True)


def per_example_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn=F.cross_entropy) -> torch.Tensor:
    """(N, n_parameters) per-example gradients by an explicit Python loop, eval mode, float64."""
    clone = copy.deepcopy(model).double().eval()
    rows = []
    for i in range(len(x)):
        clone.zero_grad(set_to_none=True)
        loss_fn(clone(x[i:i + 1].double()), y[i:i + 1]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in clone.parameters()]))
    return torch.stack(rows)


class Snapshot:
    """Everything a measurement must leave untouched: parameters, buffers, modes, grads, global RNG."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.tensors = {n: t.detach().clone() for n, t in list(model.named_parameters()) + list(model.named_buffers())}
        self.modes = [m.training for m in model.modules()]
        self.grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
        self.rng = torch.random.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None

    def assert_unchanged(self) -> None:
        now = dict(list(self.model.named_parameters()) + list(self.model.named_buffers()))
        assert now.keys() == self.tensors.keys()
        for name, before in self.tensors.items():
            assert torch.equal(now[name].detach(), before), f"{name} changed"
            assert now[name].dtype == before.dtype
        assert [m.training for m in self.model.modules()] == self.modes, "train/eval mode changed"
        for p, g in zip(self.model.parameters(), self.grads, strict=True):
            assert (p.grad is None) == (g is None) and (g is None or torch.equal(p.grad, g)), ".grad changed"
        assert torch.equal(torch.random.get_rng_state(), self.rng), "the global CPU RNG was used"
        if self.cuda_rng is not None:
            assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), self.cuda_rng, strict=True)), \
                "the global CUDA RNG was used"


class Shift(nn.Module):
    """A model with a known gradient noise: output w - x, and with `quadratic_loss` example i has
    loss 0.5 |w - x_i|^2, gradient g_i = w - x_i, so G = w - mean(x) and Sigma = cov(x)."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(w.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w - x


def quadratic_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """0.5 |out|^2 per example, mean over the batch (y unused)."""
    return 0.5 * (out ** 2).sum(1).mean()
