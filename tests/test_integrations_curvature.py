"""The curvature along training (bsresearch.measure.stability, through the Meter of bsresearch.integrations.core in
a plain loop): the sharpness, Adam's preconditioned sharpness and the batch sharpness against a dense Hessian of a
tiny model, and two problems whose answer is known: full-batch gradient descent on a small MLP brings the sharpness
to 2/lr (the edge of stability, Cohen et al. 2021), and full-batch Adam brings the preconditioned sharpness to
(2 + 2 beta1) / ((1 - beta1) lr) (Cohen et al. 2022). Also the plain loop's noise scale against the two-batch
estimator on the same micro-batches."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from measure_oracles import dense_hessian, flat_loss, tiny_mlp

from bsresearch.integrations.batches import Units
from bsresearch.integrations.core import Meter, MeterOptions, effective_sizes
from bsresearch.measure.stability import adam_preconditioner, batch_sharpness, sharpness_limit, stability_curvature
from bsresearch.noise.estimators import two_batch_estimate


def ce(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def test_sharpness_and_preconditioned_sharpness_match_the_dense_hessian():
    model, x, y = tiny_mlp(seed=1)
    model = model.double()
    x = x.double()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-6)
    for _ in range(3):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    hessian = dense_hessian(model, x, y)
    p = torch.cat([q.reshape(-1) for q in adam_preconditioner(optimizer, list(model.parameters()))]).double()
    expected_pre = torch.linalg.eigvalsh(hessian / p.sqrt()[:, None] / p.sqrt()[None, :]).max().item()
    # P^-1 H and P^-1/2 H P^-1/2 have the same eigenvalues: check against the unsymmetrised product too
    assert torch.linalg.eigvals(hessian / p[:, None]).real.max().item() == pytest.approx(expected_pre, rel=1e-8)
    got = stability_curvature(model, lambda: F.cross_entropy(model(x), y), optimizer, tol=1e-8, max_iter=200)
    assert got.sharpness_converged and got.preconditioned_converged
    assert got.sharpness == pytest.approx(torch.linalg.eigvalsh(hessian).max().item(), rel=1e-6)
    assert got.preconditioned_sharpness == pytest.approx(expected_pre, rel=1e-6)


def test_the_preconditioner_is_adams_bias_corrected_second_moment():
    w = nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    optimizer = torch.optim.AdamW([w], lr=0.1, betas=(0.9, 0.95), eps=1e-3)
    grads = [torch.tensor([0.5, 1.0]), torch.tensor([-1.5, 2.0])]
    for g in grads:
        w.grad = g.double()
        optimizer.step()
    v = 0.05 * 0.95 * grads[0] ** 2 + 0.05 * grads[1] ** 2
    expected = (v / (1 - 0.95 ** 2)).sqrt() + 1e-3
    (got,) = adam_preconditioner(optimizer, [w])
    assert torch.allclose(got.double(), expected.double(), rtol=1e-12)
    assert adam_preconditioner(torch.optim.SGD([w], lr=0.1), [w]) is None


def test_batch_sharpness_is_the_curvature_along_the_batch_gradient():
    model, x, y = tiny_mlp(seed=2)
    model, x = model.double(), x.double()
    part = slice(0, 16)
    hessian = dense_hessian(model, x[part], y[part])
    f, point = flat_loss(model, x[part], y[part])
    g = torch.autograd.functional.jacobian(f, point)
    expected = float(g @ hessian @ g / (g @ g))
    assert batch_sharpness(model, lambda: F.cross_entropy(model(x[part]), y[part])) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("optimizer, expected", [
    (lambda p: torch.optim.SGD(p, lr=0.2), 2 / 0.2),
    (lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.5), 3 / (0.5 * 0.2)),
    (lambda p: torch.optim.SGD(p, lr=0.2, momentum=0.5, nesterov=True), 3 / (2 * 0.2)),
    (lambda p: torch.optim.Adam(p, lr=0.01), 3.8 / (0.1 * 0.01)),
    (lambda p: torch.optim.RMSprop(p, lr=0.01), math.nan),
])
def test_sharpness_limits(optimizer, expected):
    limit = sharpness_limit(optimizer([nn.Parameter(torch.zeros(2))]))
    assert limit == pytest.approx(expected, nan_ok=True)


def regression():
    """A small tanh MLP on a smooth regression of 64 points: full-batch training sharpens progressively."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 10, generator=g)
    y = torch.sin(x @ torch.randn(10, 1, generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    return model, x, y


def mse(model, batch):
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def full_batch(optimizer_fn, steps: int, every: int):
    """Full-batch training in a plain loop with the Meter; its history."""
    model, x, y = regression()
    optimizer = optimizer_fn(model.parameters())
    meter = Meter(model, optimizer, mse, lambda b: Units(len(b[0])),
                  MeterOptions(sharpness_every=every, noise_every=0, lanczos_max_iter=40), probe=(x, y))
    meter.start()
    for _ in range(steps):
        optimizer.zero_grad()
        meter.micro_batch((x, y))
        mse(model, (x, y)).backward()
        meter.before_update()
        optimizer.step()
    meter.finish()
    return meter.history


def test_gradient_descent_reaches_the_edge_of_stability():
    history = full_batch(lambda p: torch.optim.SGD(p, lr=0.2), steps=600, every=50)
    measured = history.dropna(subset=["sharpness"])
    assert measured["sharpness"].iloc[0] < 0.5 * 2 / 0.2      # it starts well below the limit
    late = measured[measured["step"] > 300]
    assert len(late) == 6
    assert (late["sharpness"] - 2 / 0.2).abs().max() < 0.1 * 2 / 0.2
    assert list(late["sharpness_limit"]) == pytest.approx([2 / 0.2] * 6)


def test_adams_preconditioned_sharpness_reaches_its_limit():
    history = full_batch(lambda p: torch.optim.Adam(p, lr=0.01), steps=700, every=25)
    limit = (2 + 2 * 0.9) / ((1 - 0.9) * 0.01)
    measured = history.dropna(subset=["preconditioned_sharpness"])
    assert measured["preconditioned_sharpness"].iloc[0] < 0.5 * limit
    late = measured[measured["step"] > 300]["preconditioned_sharpness"]
    assert len(late) == 16
    assert abs(late.median() - limit) < 0.1 * limit
    # the raw sharpness stays orders of magnitude below: Adam's preconditioner sets the limit
    assert history["sharpness"].max() < 0.01 * limit


def test_the_plain_loops_noise_scale_equals_the_two_batch_estimator_on_unequal_micro_batches():
    """Micro-batches of 4, 6 and 6 examples, the loss summed over examples and divided by the 16 of the update
    (weights n_i / N): b_small is their harmonic mean and b_big the 16 examples."""
    model, x, y = tiny_mlp(seed=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = Meter(model, optimizer, ce, lambda b: Units(len(b[0])), MeterOptions())
    meter.start()
    bounds = [(0, 4), (4, 10), (10, 16)]
    for step in range(3):
        xs, ys = x[16 * step:16 * step + 16], y[16 * step:16 * step + 16]
        # the oracle differentiates copies of the parameters (the model's own carry the Meter's hooks)
        params = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}

        def gradient(a, b, params=params, xs=xs, ys=ys):
            loss = F.cross_entropy(torch.func.functional_call(model, params, (xs[a:b],)), ys[a:b])
            return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(params.values()))])
        grads = [gradient(a, b) for a, b in bounds]
        big = gradient(0, 16)
        sizes = [b - a for a, b in bounds]
        b_small = 3 / sum(1 / n for n in sizes)
        expected = two_batch_estimate(sum(float(g @ g) for g in grads) / 3, float(big @ big), b_small, 16)
        optimizer.zero_grad()
        for a, b in bounds:
            meter.micro_batch((xs[a:b], ys[a:b]))
            (ce(model, (xs[a:b], ys[a:b])) * (b - a) / 16).backward()
        row = meter.before_update([(b - a) / 16 for a, b in bounds])
        assert row is not None
        assert (row["b_small"], row["b_big"]) == pytest.approx((b_small, 16))
        assert (row["grad_sq_norm"], row["trace_cov"]) == pytest.approx(expected, rel=1e-5)
        optimizer.step()


def test_a_grad_scalers_scale_is_undone():
    """The same micro-batches with the loss scaled by 1024 (as a GradScaler scales it) and grad_scale=1024 give
    the same row as unscaled."""
    rows = []
    for scale in (1.0, 1024.0):
        model, x, y = tiny_mlp(seed=4)
        meter = Meter(model, None, ce, lambda b: Units(len(b[0])), MeterOptions())
        meter.start()
        for a, b in ((0, 8), (8, 16)):
            meter.micro_batch((x[a:b], y[a:b]))
            (ce(model, (x[a:b], y[a:b])) * 0.5 * scale).backward()
        rows.append(meter.before_update(grad_scale=scale))
    assert rows[0] is not None and rows[1] is not None
    for key in ("grad_sq_norm", "trace_cov", "b_simple"):
        assert rows[1][key] == pytest.approx(rows[0][key], rel=1e-5)


def test_effective_sizes():
    assert effective_sizes([0.5, 0.5], [10, 10]) == pytest.approx((10, 20))
    assert effective_sizes([0.25, 0.75], [10, 30]) == pytest.approx((15, 40))   # a token sum over 40
    assert effective_sizes([0.5, 0.5], [1, 100]) == pytest.approx((200 / 101, 400 / 101))  # a mean of two means
