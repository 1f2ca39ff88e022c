"""The noisy quadratic model against brute force: Monte-Carlo simulation and step-by-step iteration."""
import numpy as np
import pandas as pd
import pytest

from bsresearch.findings.nqm import (
    NQM,
    Optimizer,
    critical_batch_by_power,
    expected_loss,
    grows_with_power,
    is_stable,
    nqm_test,
    power_optimizers,
    stationary_loss,
    steps_to_target,
    steps_vs_batch_size,
    tune,
)
from bsresearch.findings.verdict import Verdict
from bsresearch.measure.critical import fit_critical_batch


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


# ----------------------------------------------------------------------------- the pre-registered test
class _Fit:
    """A stand-in CriticalBatchFit: the test only reads b_crit and its interval."""
    def __init__(self, b, low, high):
        self.b_crit, self.b_crit_interval = b, (low, high)


def _steps_table(edge=()):
    names = ("SGD", "heavy-ball momentum", "preconditioned (p=0.5)", "preconditioned + momentum")
    return pd.DataFrame([{"optimizer": n, "batch_size": 1.0, "steps": 10.0, "lr_at_grid_edge": n in edge}
                         for n in names])


@pytest.mark.parametrize("momentum, precond, verdict", [
    ((500, 420, 600), (300, 260, 350), Verdict.REPRODUCED),
    ((500, 420, 600), (180, 150, 220), Verdict.PARTLY),      # preconditioning's ratio 1.8 < 2
    ((500, 110, 900), (300, 260, 350), Verdict.PARTLY),      # momentum's interval overlaps SGD's [90, 110]
    ((150, 120, 180), (190, 105, 260), Verdict.NOT_REPRODUCED),
])
def test_nqm_verdict_needs_ratio_two_and_an_interval_above_sgds(momentum, precond, verdict):
    fits = {"SGD": _Fit(100, 90, 110), "heavy-ball momentum": _Fit(*momentum),
            "preconditioned (p=0.5)": _Fit(*precond)}
    test = nqm_test(fits, _steps_table())
    assert test.rho_momentum == pytest.approx(momentum[0] / 100)
    assert test.rho_precondition == pytest.approx(precond[0] / 100)
    assert test.verdict == verdict


def test_nqm_is_not_testable_with_a_tuned_lr_on_the_grid_edge():
    fits = {"SGD": _Fit(100, 90, 110), "heavy-ball momentum": _Fit(500, 420, 600),
            "preconditioned (p=0.5)": _Fit(300, 260, 350)}
    assert nqm_test(fits, _steps_table(edge=("heavy-ball momentum",))).verdict == Verdict.NOT_TESTABLE
    # an edge in an optimizer outside the test does not block it
    assert nqm_test(fits, _steps_table(edge=("preconditioned + momentum",))).verdict == Verdict.REPRODUCED
    with pytest.raises(ValueError, match="no critical-batch fit"):
        nqm_test({"SGD": _Fit(1, 1, 1)}, _steps_table())


def test_nqm_test_on_the_exact_model_uses_fit_critical_batch():
    nqm = small_nqm(50)
    lrs = np.logspace(-3, 1, 17)
    table = pd.DataFrame(steps_vs_batch_size(nqm, [1, 4, 16, 64, 256], 0.05 * nqm.initial_loss(), lrs=lrs))
    fits = {n: fit_critical_batch(g["batch_size"], g["steps"]) for n, g in table.groupby("optimizer")}
    test = nqm_test(fits, table)
    assert test.b_crit["SGD"][0] == pytest.approx(fits["SGD"].b_crit)
    assert test.rho_momentum == pytest.approx(fits["heavy-ball momentum"].b_crit / fits["SGD"].b_crit)


def test_powers_table_and_monotonicity():
    opts = power_optimizers([0.0, 0.5, 1.0], momenta=(0.0, 0.9))
    assert opts["p=0"] == ((0.0,), 0.0) and opts["p=1 + momentum"] == ((0.0, 0.9), 1.0)
    # synthetic tuned steps with a known B_crit per (power, momentum): S = 100 (1 + B_crit / B)
    b = np.array([1.0, 4, 16, 64, 256, 1024])
    known = {("p=0", 0.0): 10.0, ("p=0.5", 0.5): 40.0, ("p=1", 1.0): 30.0,
             ("p=0 + momentum", 0.0): 20.0, ("p=0.5 + momentum", 0.5): 80.0, ("p=1 + momentum", 1.0): 160.0}
    rows = [{"optimizer": name, "precondition": p, "batch_size": x, "steps": 100 * (1 + bc / x),
             "lr_at_grid_edge": False} for (name, p), bc in known.items() for x in b]
    table = critical_batch_by_power(pd.DataFrame(rows))
    assert list(table["power"]) == [0.0, 0.5, 1.0, 0.0, 0.5, 1.0]
    assert list(table["b_crit"]) == pytest.approx([10, 40, 30, 20, 80, 160], rel=1e-6)
    assert list(table["b_crit"]) == pytest.approx([fit_critical_batch(b, 100 * (1 + bc / b)).b_crit
                                                   for bc in (10, 40, 30, 20, 80, 160)])
    assert grows_with_power(table) == {False: False, True: True}   # 40 -> 30 breaks it without momentum
    # a batch size that never reached the target is left out of the fit and counted
    rows[0]["steps"] = float("inf")
    again = critical_batch_by_power(pd.DataFrame(rows))
    assert list(again["n_unreached"]) == [1, 0, 0, 0, 0, 0]
    assert again["b_crit"].iloc[0] == pytest.approx(fit_critical_batch(b[1:], 100 * (1 + 10 / b[1:])).b_crit)
