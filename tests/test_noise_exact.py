"""noise.exact: the exact per-example gradient noise scale against an explicit per-example loop (the oracle), a
brute-force bootstrap and a problem whose gradient noise is known."""
import copy
import math

import numpy as np
import pytest
import torch
from conftest import requires_cuda
from measure_oracles import Shift, Snapshot, per_example_loop, quadratic_loss, tiny_mlp

from bsresearch.measure.functional import layer_slices
from bsresearch.noise import exact
from bsresearch.noise.pairs import two_batch_noise_scale


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def loop_statistics(grads: torch.Tensor, unbiased: bool) -> dict[str, float]:
    """The textbook formulas on explicit per-example gradients (N, P), float64."""
    n = len(grads)
    mean = grads.mean(0)
    trace_cov = float(((grads - mean) ** 2).sum() / (n - 1))
    grad_sq = float(mean @ mean) - (trace_cov / n if unbiased else 0.0)
    return {"trace_cov": trace_cov, "grad_sq_norm": grad_sq, "b_simple": trace_cov / grad_sq}


@pytest.fixture(scope="module")
def problem():
    model, x, y = tiny_mlp(n=256, train_steps=10)   # B_simple about 40, well below N: a well-posed estimate
    return model, x, y, per_example_loop(model, x, y)


def test_per_example_gradients_equal_the_explicit_loop(problem):
    model, x, y, loop = problem
    assert torch.allclose(exact.per_example_gradients(model, x, y).double(), loop, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("chunk_size", [7, 64])
def test_exact_statistics_equal_the_explicit_loop(problem, unbiased, chunk_size):
    model, x, y, loop = problem
    result = exact.gradient_noise_scale(model, x, y, chunk_size=chunk_size, unbiased=unbiased, per_layer=True)
    expected = loop_statistics(loop, unbiased)
    assert result.n_examples == len(x) and result.unbiased == unbiased and result.bn_mode == "eval"
    for key, value in expected.items():
        assert getattr(result, key) == pytest.approx(value, rel=1e-4)
    assert result.mean_grad_sq_norm == pytest.approx(float(loop.mean(0) @ loop.mean(0)), rel=1e-4)
    for layer, part in layer_slices(model).items():
        for key, value in loop_statistics(loop[:, part], unbiased).items():
            assert getattr(result.per_layer[layer], key) == pytest.approx(value, rel=1e-4)
    # tr(Sigma) is additive over layers
    assert sum(r.trace_cov for r in result.per_layer.values()) == pytest.approx(result.trace_cov, rel=1e-6)


def test_bootstrap_interval_equals_a_brute_force_bootstrap(problem):
    model, x, y, loop = problem
    result = exact.gradient_noise_scale(model, x, y, unbiased=False, n_bootstrap=300, generator=gen(5))
    # the oracle: the same resamples (same generator draws), statistics recomputed from explicit gradients
    idx = torch.randint(len(x), (300, len(x)), generator=gen(5))
    replicates = [loop_statistics(loop[row], unbiased=False)["b_simple"] for row in idx]
    expected = np.quantile(replicates, [0.025, 0.975])
    assert result.b_simple_interval == pytest.approx(tuple(expected), rel=1e-4)
    assert result.b_simple_interval[0] < result.b_simple < result.b_simple_interval[1]
    assert result.confidence == 0.95 and result.n_bootstrap == 300


def known_noise_problem(n, dim=10, sigma=1.0, seed=0):
    """Examples x_i ~ N(mu, sigma^2 I) and the Shift model: g_i = w - x_i. True |G|^2 = |w - mu|^2,
    true tr(Sigma) = dim sigma^2."""
    g = gen(seed)
    mu = torch.randn(dim, generator=g, dtype=torch.float64)
    w = mu + 0.3 * torch.randn(dim, generator=g, dtype=torch.float64)
    x = mu + sigma * torch.randn(n, dim, generator=g, dtype=torch.float64)
    truth = {"grad_sq_norm": float((w - mu) @ (w - mu)), "trace_cov": dim * sigma ** 2}
    truth["b_simple"] = truth["trace_cov"] / truth["grad_sq_norm"]
    return Shift(w), x, torch.zeros(n, dtype=torch.long), truth


def test_a_non_positive_unbiased_gradient_estimate_gives_infinite_b_simple():
    model, x, y, _ = known_noise_problem(n=100)
    model.w.data = x.mean(0)   # the mean gradient is exactly zero: |G|^2 - tr(Sigma)/N < 0
    result = exact.gradient_noise_scale(model, x, y, loss_fn=quadratic_loss)
    assert result.grad_sq_norm < 0 and result.b_simple == math.inf
    assert exact.gradient_noise_scale(model, x, y, loss_fn=quadratic_loss, unbiased=False).b_simple > 1e6


def test_exact_statistics_recover_a_known_gradient_noise():
    model, x, y, truth = known_noise_problem(n=20_000)
    result = exact.gradient_noise_scale(model, x, y, chunk_size=4096, loss_fn=quadratic_loss)
    assert result.trace_cov == pytest.approx(truth["trace_cov"], rel=0.03)
    assert result.grad_sq_norm == pytest.approx(truth["grad_sq_norm"], rel=0.1)
    assert result.b_simple == pytest.approx(truth["b_simple"], rel=0.1)


@pytest.mark.parametrize("name", ["exact", "bootstrap"])
def test_model_and_rng_are_left_exactly_as_found(name):
    model, x, y = tiny_mlp(batchnorm=True, train_steps=5)
    snapshot = Snapshot(model)
    {"exact": lambda: exact.gradient_noise_scale(model, x, y, per_layer=True),
     "bootstrap": lambda: exact.gradient_noise_scale(model, x, y, n_bootstrap=10, generator=gen())}[name]()
    snapshot.assert_unchanged()


@requires_cuda
def test_cuda_noise_scale_matches_cpu(problem):
    model, x, y, loop = problem
    gpu = copy.deepcopy(model).cuda()
    result = exact.gradient_noise_scale(gpu, x.cuda(), y.cuda(), n_bootstrap=20,
                                        generator=torch.Generator("cuda").manual_seed(0))
    assert result.b_simple == pytest.approx(loop_statistics(loop, True)["b_simple"], rel=1e-3)
    two = two_batch_noise_scale(gpu, x.cuda(), y.cuda(), 4, 32, n_draws=5,
                                generator=torch.Generator("cuda").manual_seed(0))
    assert np.isfinite(two.trace_cov)
