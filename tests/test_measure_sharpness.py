"""Sharpness against closed forms on a quadratic, brute force over box vertices, and the ReLU
rescaling of Dinh et al. (the function is unchanged; adaptive sharpness must be unchanged too)."""
import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import requires_cuda
from measure_oracles import Shift, Snapshot, quadratic_loss, tiny_mlp

from bsresearch.measure import curvature
from bsresearch.measure import sharpness as sh
from bsresearch.measure.functional import flatten


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def quadratic_problem(n=50, dim=6, seed=0):
    """Shift model with loss 0.5 |w - x_i|^2: f(w) = 0.5 |w - mean(x)|^2 + const, everything in closed form."""
    g = gen(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    w = x.mean(0) + 0.5 * torch.randn(dim, generator=g, dtype=torch.float64)
    return Shift(w), x, torch.zeros(n, dtype=torch.long)


def f_quadratic(w, x):
    return float(0.5 * ((w - x) ** 2).sum(1).mean())


@pytest.mark.parametrize("eps", [1e-3, 5e-4, 0.1])
def test_keskar_full_space_equals_the_closed_form_maximum(eps):
    model, x, y = quadratic_problem()
    w = model.w.detach()
    box = eps * (w.abs() + 1)
    best = w + torch.sign(w - x.mean(0)) * box   # a convex function of a box is largest at the far corner
    f0, f_max = f_quadratic(w, x), f_quadratic(best, x)
    result = sh.keskar_sharpness(model, x, y, eps, loss_fn=quadratic_loss)
    assert result.loss == pytest.approx(f0, rel=1e-12)
    assert result.loss_at_max == pytest.approx(f_max, rel=1e-9)
    assert result.phi == pytest.approx((f_max - f0) / (1 + f0) * 100, rel=1e-6)
    assert np.allclose(result.box, box.numpy()) and result.subspace_dim is None


def test_keskar_subspace_does_not_beat_the_brute_force_over_vertices():
    model, x, y = quadratic_problem(dim=12)
    p = 5
    result = sh.keskar_sharpness(model, x, y, 0.05, subspace_dim=p, generator=gen(3), loss_fn=quadratic_loss)
    # the same random A (first draw from the same generator), then every vertex of the box
    matrix = torch.randn(12, p, generator=gen(3)).double()
    w = model.w.detach()
    box = 0.05 * ((torch.linalg.pinv(matrix) @ w).abs() + 1)
    assert np.allclose(result.box, box.numpy(), rtol=1e-5)
    vertices = [torch.tensor(s, dtype=torch.float64) * box for s in itertools.product([-1, 1], repeat=p)]
    best = max(f_quadratic(w + matrix @ v, x) for v in vertices)
    assert result.loss_at_max <= best * (1 + 1e-9)
    assert result.loss_at_max == pytest.approx(f_quadratic(w + matrix @ torch.from_numpy(result.maximiser), x),
                                               rel=1e-6)
    assert np.all(np.abs(result.maximiser) <= result.box * (1 + 1e-12))


@pytest.fixture(scope="module")
def trained():
    return tiny_mlp(n=128, train_steps=300)


def loss_at(model, flat, x, y):
    clone = copy.deepcopy(model).eval()
    start = 0
    with torch.no_grad():
        for p in clone.parameters():
            p.copy_(flat[start:start + p.numel()].view_as(p))
            start += p.numel()
        return float(F.cross_entropy(clone(x), y))


@pytest.mark.parametrize("subspace_dim", [None, 10])
def test_keskar_is_nonnegative_zero_at_zero_eps_grows_with_eps_and_respects_the_box(trained, subspace_dim):
    model, x, y = trained
    results = [sh.keskar_sharpness(model, x, y, eps, subspace_dim=subspace_dim, generator=gen())
               for eps in (0.0, 1e-4, 1e-3, 1e-2)]
    assert results[0].phi == 0.0 and results[0].loss_at_max == results[0].loss
    phis = [r.phi for r in results]
    assert all(a < b for a, b in zip(phis, phis[1:])), phis
    theta = flatten({n: p.detach() for n, p in model.named_parameters()})
    matrix = torch.randn(theta.numel(), 10, generator=gen()) if subspace_dim else None
    for r in results:
        assert r.n_iterations <= 10 and r.n_evaluations >= 1
        assert np.all(np.abs(r.maximiser) <= r.box * (1 + 1e-12))
        step = torch.from_numpy(r.maximiser).float()
        perturbed = theta + (matrix @ step if matrix is not None else step)
        assert loss_at(model, perturbed, x, y) == pytest.approx(r.loss_at_max, rel=1e-5)


def test_worst_case_equals_the_closed_form_on_a_quadratic():
    model, x, y = quadratic_problem()
    a = (model.w.detach() - x.mean(0)).norm().item()
    for rho, n_steps in [(0.1, 1), (0.1, 5), (1.0, 3)]:
        result = sh.worst_case_sharpness(model, x, y, rho, n_steps=n_steps, loss_fn=quadratic_loss)
        assert result.sharpness == pytest.approx(rho * a + rho ** 2 / 2, rel=1e-9)
        assert result.kind == "worst_case" and not result.adaptive


@pytest.mark.parametrize("adaptive", [False, True])
def test_average_case_equals_the_closed_form_within_its_error_bars(adaptive):
    model, x, y = quadratic_problem()
    sigma = 0.05
    result = sh.average_case_sharpness(model, x, y, sigma, n_samples=200, adaptive=adaptive, generator=gen(),
                                       loss_fn=quadratic_loss)
    scale_sq = (model.w.detach() ** 2).sum().item() if adaptive else x.shape[1]
    assert abs(result.sharpness - sigma ** 2 * scale_sq / 2) <= 3 * result.std_error


def test_m_sharpness_averages_the_worst_case_of_each_batch(trained):
    model, x, y = trained
    result = sh.m_sharpness(model, x, y, rho=0.1, m=32, n_batches=3, n_steps=2, generator=gen(4))
    order = torch.randperm(len(x), generator=gen(4))
    per_batch = [sh.worst_case_sharpness(model, x[order[i * 32:(i + 1) * 32]], y[order[i * 32:(i + 1) * 32]], 0.1,
                                         n_steps=2).sharpness for i in range(3)]
    assert result.sharpness == pytest.approx(np.mean(per_batch), rel=1e-6)
    assert result.m == 32 and result.n_examples == 96 and result.std_error > 0


def rescaled(model, a):
    """Dinh et al.: multiply the first layer (weights and bias) by a and the next layer's weights by 1/a."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out[0].weight.mul_(a)
        out[0].bias.mul_(a)
        out[2].weight.div_(a)
    return out


def test_relu_rescaling_changes_curvature_but_not_adaptive_sharpness():
    model, x, y = tiny_mlp(n=128, train_steps=300, dtype=torch.float64)
    other = rescaled(model, 4.0)
    assert torch.allclose(model(x), other(x), rtol=1e-12, atol=1e-12)   # the same function
    top = [curvature.top_eigenvalues(m, [(x, y)], tol=1e-6).eigenvalues[0] for m in (model, other)]
    assert abs(top[1] / top[0] - 1) > 0.5                              # but not the same curvature
    worst = [sh.worst_case_sharpness(m, x, y, 0.5, adaptive=True).sharpness for m in (model, other)]
    average = [sh.average_case_sharpness(m, x, y, 0.1, adaptive=True, generator=gen()).sharpness
               for m in (model, other)]
    assert worst[1] == pytest.approx(worst[0], rel=1e-6) and worst[0] > 0
    assert average[1] == pytest.approx(average[0], rel=1e-6)
    plain = [sh.worst_case_sharpness(m, x, y, 0.5).sharpness for m in (model, other)]
    assert abs(plain[1] / plain[0] - 1) > 0.1                          # plain sharpness is not invariant


@pytest.mark.parametrize("name", ["keskar", "keskar_subspace", "worst", "average", "m"])
@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_model_and_rng_are_left_exactly_as_found(name, bn_mode):
    model, x, y = tiny_mlp(batchnorm=True, train_steps=5)
    snapshot = Snapshot(model)
    {"keskar": lambda: sh.keskar_sharpness(model, x, y, 1e-3, max_iter=3, bn_mode=bn_mode),
     "keskar_subspace": lambda: sh.keskar_sharpness(model, x, y, 1e-3, subspace_dim=4, max_iter=3, bn_mode=bn_mode),
     "worst": lambda: sh.worst_case_sharpness(model, x, y, 0.1, n_steps=2, adaptive=True, bn_mode=bn_mode),
     "average": lambda: sh.average_case_sharpness(model, x, y, 0.1, n_samples=3, bn_mode=bn_mode),
     "m": lambda: sh.m_sharpness(model, x, y, 0.1, m=16, n_batches=2, n_steps=1, bn_mode=bn_mode)}[name]()
    snapshot.assert_unchanged()


def test_keskar_rejects_negative_eps(trained):
    model, x, y = trained
    with pytest.raises(ValueError, match="eps must be >= 0"):
        sh.keskar_sharpness(model, x, y, -1e-3)


@requires_cuda
def test_cuda_sharpness_matches_cpu(trained):
    model, x, y = trained
    gpu = copy.deepcopy(model).cuda()
    cpu = sh.keskar_sharpness(model, x, y, 1e-3)
    cuda = sh.keskar_sharpness(gpu, x.cuda(), y.cuda(), 1e-3)
    assert cuda.phi == pytest.approx(cpu.phi, rel=1e-2)
    avg = sh.average_case_sharpness(gpu, x.cuda(), y.cuda(), 0.01, generator=torch.Generator("cuda").manual_seed(0))
    assert np.isfinite(avg.sharpness)
