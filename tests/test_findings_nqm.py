"""The noisy quadratic model against brute force: Monte-Carlo simulation and step-by-step iteration."""
import numpy as np
import pytest

from bsresearch.findings.nqm import (
    NQM,
    Optimizer,
    expected_loss,
    is_stable,
    stationary_loss,
    steps_to_target,
    steps_vs_batch_size,
    tune,
)


def small_nqm(dim=20):
    h = 1.0 / np.arange(1, dim + 1)
    return NQM(curvatures=h, noise=h.copy(), init_sq=np.ones(dim))


def simulate(nqm, opt, batch_size, steps, n_paths, seed=0):
    """Oracle: run the stochastic process itself on n_paths independent trajectories."""
    rng = np.random.default_rng(seed)
    h = nqm.curvatures
    a = opt.lr * h ** (-opt.precondition)
    theta = rng.standard_normal((n_paths, len(h))) * np.sqrt(nqm.init_sq)
    v = np.zeros_like(theta)
    losses = []
    for _ in range(steps):
        eps = rng.standard_normal(theta.shape) * np.sqrt(nqm.noise / batch_size)
        v = opt.momentum * v - a * (h * theta + eps)
        theta = theta + v
        losses.append(0.5 * np.sum(h * theta ** 2, axis=1))
    return np.array(losses)   # (steps, n_paths)


@pytest.mark.parametrize("opt", [Optimizer(0.5), Optimizer(0.3, momentum=0.9), Optimizer(0.2, 0.5, 0.5)])
def test_expected_loss_matches_monte_carlo(opt):
    nqm = small_nqm()
    sim = simulate(nqm, opt, batch_size=4, steps=60, n_paths=20_000)
    exact = expected_loss(nqm, opt, 4, range(1, 61))
    stderr = sim.std(1) / np.sqrt(sim.shape[1])
    assert np.all(np.abs(sim.mean(1) - exact) < 5 * stderr + 1e-12)


def iterate_moments(nqm, opt, batch_size, steps):
    """Oracle: apply the one-step second-moment update `steps` times."""
    h = nqm.curvatures
    a = opt.lr * h ** (-opt.precondition)
    q = nqm.noise / batch_size
    m11, m12, m22 = nqm.init_sq.copy(), np.zeros_like(h), np.zeros_like(h)
    out = [0.5 * np.sum(h * m11)]
    b = opt.momentum
    for _ in range(steps):
        # theta' = (1 - a h) theta + b v - a eps ; v' = -a h theta + b v - a eps
        t11 = (1 - a * h) ** 2 * m11 + 2 * (1 - a * h) * b * m12 + b * b * m22 + a * a * q
        t12 = (1 - a * h) * (-a * h) * m11 + ((1 - a * h) * b + b * (-a * h)) * m12 + b * b * m22 + a * a * q
        t22 = (a * h) ** 2 * m11 - 2 * a * h * b * m12 + b * b * m22 + a * a * q
        m11, m12, m22 = t11, t12, t22
        out.append(0.5 * np.sum(h * m11))
    return np.array(out)


@pytest.mark.parametrize("opt", [Optimizer(0.5), Optimizer(0.1, 0.9), Optimizer(0.05, 0.99, 0.5), Optimizer(1.9)])
def test_steps_to_target_equals_step_by_step_iteration(opt):
    nqm = small_nqm(200)
    losses = iterate_moments(nqm, opt, batch_size=64, steps=5000)
    assert np.allclose(expected_loss(nqm, opt, 64, [0, 1, 7, 100, 4999]), losses[[0, 1, 7, 100, 4999]], rtol=1e-9)
    for target in (0.5 * losses[0], 0.1 * losses[0], 2 * losses[-1]):
        expected = int(np.argmax(losses <= target)) if np.any(losses <= target) else float("inf")
        assert steps_to_target(nqm, opt, 64, target) == expected


def test_stability_and_noise_floor():
    nqm = small_nqm()
    assert is_stable(nqm, Optimizer(1.9)) and not is_stable(nqm, Optimizer(2.1))
    assert is_stable(nqm, Optimizer(3.5, momentum=0.9)) and not is_stable(nqm, Optimizer(3.9, momentum=0.9))
    assert steps_to_target(nqm, Optimizer(2.1), 10, 0.1) == float("inf")
    floor = stationary_loss(nqm, Optimizer(0.5), 1)
    assert steps_to_target(nqm, Optimizer(0.5), 1, 0.9 * floor) == float("inf")
    # the floor falls like 1/B (noise variance C/B)
    assert stationary_loss(nqm, Optimizer(0.5), 10) == pytest.approx(floor / 10, rel=1e-9)


def test_sgd_scales_perfectly_at_small_batch_and_saturates_at_large():
    nqm = NQM.zhang(2000)
    target = 0.05 * nqm.initial_loss()
    lrs = np.logspace(-4, np.log10(1.99), 60)
    rows = {b: tune(nqm, b, target, lrs).steps for b in (1, 2, 4, 2**14, 2**15)}
    assert rows[2] / rows[1] == pytest.approx(0.5, abs=0.06)
    assert rows[4] / rows[2] == pytest.approx(0.5, abs=0.06)
    assert rows[2**15] / rows[2**14] > 0.9


def test_steps_vs_batch_size_rows():
    rows = steps_vs_batch_size(NQM.zhang(500), [1, 4, 16, 64], target=0.2, lrs=np.logspace(-3, 0.3, 20),
                               optimizers={"SGD": ((0.0,), 0.0)})
    assert [r["batch_size"] for r in rows] == [1, 4, 16, 64] and all(r["optimizer"] == "SGD" for r in rows)
    steps = [r["steps"] for r in rows]
    assert all(np.isfinite(steps)) and steps == sorted(steps, reverse=True)   # larger batches never need more steps
