"""noise.hessian: B_noise = tr(H Sigma) / (G^T H G) against the dense Hessian and the per-example loop."""
import numpy as np
import pytest
import torch
from measure_oracles import Snapshot, dense_hessian, per_example_loop, tiny_mlp
from test_noise_exact import gen

from bsresearch.noise.hessian import hessian_noise_scale


@pytest.fixture(scope="module")
def problem():
    model, x, y = tiny_mlp(n=256, train_steps=10)
    return model, x, y, per_example_loop(model, x, y)


def test_b_noise_against_the_dense_hessian(problem):
    model, x, y, loop = problem
    hessian = dense_hessian(model, x, y)
    deviations = loop - loop.mean(0)
    exact_trace = float(torch.einsum("ip,pq,iq->", deviations, hessian, deviations)) / (len(x) - 1)
    mean = loop.mean(0)
    exact_ghg = float(mean @ hessian @ mean)
    result = hessian_noise_scale(model, x, y, n_probes=100, chunk_size=20, generator=gen())
    assert result.g_h_g == pytest.approx(exact_ghg, rel=1e-4)
    assert result.b_noise == pytest.approx(result.trace_h_sigma / result.g_h_g)
    assert result.n_products == 101
    # the same sign vectors put through the dense formulas give the same estimate...
    g = gen()
    signs = [(torch.randint(0, 2, (len(x),), generator=g) * 2 - 1).double() for _ in range(100)]
    samples = np.array([float((z @ deviations) @ hessian @ (z @ deviations)) / (len(x) - 1) for z in signs])
    assert result.trace_h_sigma == pytest.approx(samples.mean(), rel=1e-4)
    assert result.trace_h_sigma_std_error == pytest.approx(samples.std(ddof=1) / 10, rel=1e-3)
    # ...which is unbiased: within its error bars of the exact tr(H Sigma) (the samples are skewed: 4 SE)
    assert abs(result.trace_h_sigma - exact_trace) <= 4 * result.trace_h_sigma_std_error


def test_model_and_rng_are_left_exactly_as_found():
    model, x, y = tiny_mlp(batchnorm=True, train_steps=5)
    snapshot = Snapshot(model)
    hessian_noise_scale(model, x, y, n_probes=2, generator=gen())
    snapshot.assert_unchanged()
