"""Curvature measurements against a dense Hessian (torch.autograd.functional.hessian) of a tiny MLP."""
import numpy as np
import pytest
import torch
from conftest import requires_cuda
from measure_oracles import Snapshot, dense_hessian, tiny_mlp

from bsresearch.config import ConfigError
from bsresearch.measure import curvature as cv
from bsresearch.measure.functional import MeanLoss, batches_of, layer_slices, measuring
from bsresearch.measure.lanczos import hutchinson_trace, lanczos, power_iteration, stochastic_lanczos_quadrature


@pytest.fixture(scope="module")
def problem():
    model, x, y = tiny_mlp()
    hessian = dense_hessian(model, x, y)
    return model, x, y, hessian, torch.linalg.eigvalsh(hessian).flip(0).numpy()


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_hvp_equals_dense_hessian_times_vector(problem):
    model, x, y, hessian, _ = problem
    v = torch.randn(hessian.shape[0], generator=gen())
    hv = cv.hvp(model, batches_of(x, y, 10), v)   # 7 uneven batches: the mean over them is the full mean
    assert torch.allclose(hv.double(), hessian @ v.double(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("batchnorm, bn_mode", [(False, "eval"), (True, "train")])
def test_cached_and_rebuilt_graphs_give_the_same_products(batchnorm, bn_mode):
    """The cached gradient graph (all batches, some batches under a small budget) against rebuilding
    every batch's graph per product (budget 0), several products in a row, and against the dense Hessian."""
    model, x, y = tiny_mlp(batchnorm=batchnorm)
    batches = batches_of(x, y, 10)   # 7 uneven batches
    vectors = torch.randn(4, sum(p.numel() for p in model.parameters()), generator=gen())
    products, cached = {}, {}
    with measuring(model, bn_mode):
        full = MeanLoss(model, batches)
        products["all"] = torch.stack([full.hvp(v) for v in vectors])
        partial = MeanLoss(model, batches, graph_budget_bytes=full.graph_bytes // 2)
        products["some"] = torch.stack([partial.hvp(v) for v in vectors])
        rebuilt = MeanLoss(model, batches, graph_budget_bytes=0)
        products["none"] = torch.stack([rebuilt.hvp(v) for v in vectors])
        # a product at another point never uses the cache: there it equals rebuilding
        shifted = full.point + 0.1
        assert torch.allclose(full.hvp(vectors[0], shifted), rebuilt.hvp(vectors[0], shifted), rtol=1e-5, atol=1e-7)
        cached = {"all": full.cached_batches, "some": partial.cached_batches, "none": rebuilt.cached_batches}
    assert cached["all"] == 7 and 0 < cached["some"] < 7 and cached["none"] == 0
    assert full.graph_bytes > 0 and rebuilt.graph_bytes == 0 and full.n_products == 5
    for name in ("all", "some"):
        assert torch.allclose(products[name], products["none"], rtol=1e-5, atol=1e-7), name
    if bn_mode == "eval":   # (train mode normalises each batch of 10 alone: not the full-batch Hessian)
        exact = dense_hessian(model, x, y)
        assert torch.allclose(products["all"].double(), vectors.double() @ exact, rtol=1e-4, atol=1e-6)


def test_a_zero_budget_falls_back_to_rebuilding_and_still_finds_the_spectrum(problem):
    model, x, y, _, eigenvalues = problem
    batches = batches_of(x, y, 20)
    rebuilt = cv.top_eigenvalues(model, batches, k=3, tol=1e-5, generator=gen(), graph_budget_bytes=0)
    cached = cv.top_eigenvalues(model, batches, k=3, tol=1e-5, generator=gen())
    assert rebuilt.converged and np.max(np.abs(np.array(rebuilt.eigenvalues) / eigenvalues[:3] - 1)) <= 1e-4
    assert rebuilt.eigenvalues == pytest.approx(cached.eigenvalues, rel=1e-5)
    with pytest.raises(ConfigError, match="graph_budget_bytes must be a non-negative integer; got -1"):
        cv.hessian_trace(model, batches, graph_budget_bytes=-1)


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_top_k_eigenvalues_match_the_dense_spectrum(problem, method):
    model, x, y, hessian, eigenvalues = problem
    k = 3
    result = cv.top_eigenvalues(model, batches_of(x, y, 20), k=k, method=method, tol=1e-5, generator=gen())
    exact = eigenvalues[:k] if method == "lanczos" else sorted(eigenvalues, key=abs, reverse=True)[:k]
    assert result.converged and result.method == method and result.n_products > k
    assert np.max(np.abs(np.array(result.eigenvalues) / exact - 1)) <= 1e-4
    # the eigenvectors are unit and satisfy H u = lambda u
    u = result.eigenvectors.double()
    assert torch.allclose(u.norm(dim=1), torch.ones(k, dtype=torch.float64), atol=1e-5)
    residual = (hessian @ u.T - u.T * torch.tensor(exact)).norm(dim=0) / torch.tensor(exact).abs()
    assert residual.max() < 1e-3


def test_lanczos_needs_fewer_products_than_power_iteration(problem):
    model, x, y, _, _ = problem
    batches = batches_of(x, y, 64)
    lz = cv.top_eigenvalues(model, batches, k=3, tol=1e-4, generator=gen())
    pw = cv.top_eigenvalues(model, batches, k=3, tol=1e-4, method="power", generator=gen())
    assert lz.converged and pw.converged and lz.n_products < pw.n_products


def test_unconverged_runs_say_so():
    matrix = torch.diag(torch.linspace(1.0, 1.01, 200, dtype=torch.float64))  # clustered: slow convergence
    like = torch.zeros(200, dtype=torch.float64)
    assert not lanczos(lambda v: matrix @ v, like, k=1, tol=1e-12, max_iter=5).converged
    result = power_iteration(lambda v: matrix @ v, like, k=1, tol=1e-12, max_iter=7)
    assert not result.converged and result.n_products == 7


def test_lanczos_which_largest_vs_magnitude():
    values = torch.tensor([-5.0, -1.0, 0.5, 2.0, 3.0], dtype=torch.float64)
    q = torch.linalg.qr(torch.randn(5, 5, generator=gen(), dtype=torch.float64))[0]
    matrix = q @ torch.diag(values) @ q.T
    like = torch.zeros(5, dtype=torch.float64)
    largest = lanczos(lambda v: matrix @ v, like, k=2, tol=1e-10, generator=gen())
    magnitude = lanczos(lambda v: matrix @ v, like, k=2, tol=1e-10, generator=gen(), which="magnitude")
    assert largest.eigenvalues == pytest.approx((3.0, 2.0), rel=1e-10)
    assert magnitude.eigenvalues == pytest.approx((-5.0, 3.0), rel=1e-10)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hutchinson_trace_within_its_own_error_bars(problem, seed):
    model, x, y, hessian, _ = problem
    estimate = cv.hessian_trace(model, batches_of(x, y, 64), n_probes=30, generator=gen(seed))
    exact = float(hessian.trace())
    assert estimate.n_probes == estimate.n_products == 30 and estimate.std_error > 0
    assert abs(estimate.trace - exact) <= 3 * estimate.std_error


def test_hutchinson_is_exact_on_a_diagonal_matrix():
    """Rademacher probes have z_i^2 = 1: for a diagonal matrix every probe gives the trace exactly."""
    diagonal = torch.arange(1.0, 11.0, dtype=torch.float64)
    estimate = hutchinson_trace(lambda v: diagonal * v, torch.zeros(10, dtype=torch.float64), n_probes=3)
    assert estimate.trace == pytest.approx(55.0) and estimate.std_error == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("reorthogonalize", [False, True])
def test_spectral_density_mass_and_mean_match_the_dense_spectrum(problem, reorthogonalize):
    model, x, y, hessian, eigenvalues = problem
    density = cv.spectral_density(model, batches_of(x, y, 64), n_probes=20, n_iter=30, generator=gen(),
                                  reorthogonalize=reorthogonalize)
    assert density.mass() == pytest.approx(1.0, abs=1e-6)
    exact_mean = eigenvalues.mean()
    assert abs(density.moment(1) - exact_mean) <= 3 * density.moment_std_error(1)
    exact_second = (eigenvalues ** 2).mean()
    assert abs(density.moment(2) - exact_second) <= 3 * density.moment_std_error(2)
    # the smoothed density integrates to its mass over a grid covering the spectrum
    grid = np.linspace(eigenvalues.min() - 1, eigenvalues.max() + 1, 4001)
    values = density.density(grid, sigma=0.02)
    assert np.sum(values) * (grid[1] - grid[0]) == pytest.approx(1.0, abs=1e-3)
    assert density.n_products == 20 * 30


def test_full_length_reorthogonalised_quadrature_nodes_are_the_eigenvalues(problem):
    """With as many Lanczos steps as parameters, the Gauss nodes are exactly the Hessian's eigenvalues."""
    model, x, y, hessian, eigenvalues = problem
    dim = hessian.shape[0]
    density = cv.spectral_density(model, batches_of(x, y, 64), n_probes=2, n_iter=dim, generator=gen(),
                                  reorthogonalize=True)
    scale = np.abs(eigenvalues).max()
    for nodes, weights in zip(density.nodes, density.weights, strict=True):
        for node in nodes[weights > 1e-6]:
            assert np.min(np.abs(eigenvalues - node)) <= 1e-4 * scale


def test_quadrature_on_an_explicit_matrix_is_exact_for_low_moments():
    """Gauss quadrature with m nodes is exact for polynomials up to degree 2m - 1, for each probe."""
    values = torch.linspace(-1.0, 4.0, 50, dtype=torch.float64)
    like = torch.zeros(50, dtype=torch.float64)
    density = stochastic_lanczos_quadrature(lambda v: values * v, like, n_probes=1, n_iter=3, generator=gen())
    z = torch.randint(0, 2, (50,), generator=gen()) * 2.0 - 1  # the probe: the same first draw
    z = z.double() / 50 ** 0.5
    for order in range(6):
        assert density.moment(order) == pytest.approx(float((z ** 2 * values ** order).sum()), rel=1e-8, abs=1e-10)


def test_per_layer_curvature_matches_the_dense_blocks(problem):
    model, x, y, hessian, _ = problem
    result = cv.layer_curvature(model, batches_of(x, y, 64), n_probes=30, tol=1e-5, generator=gen())
    assert list(result) == ["0", "2"]
    for layer, part in layer_slices(model).items():
        block = hessian[part, part]
        top = torch.linalg.eigvalsh(block).max().item()
        r = result[layer]
        assert r.n_parameters == block.shape[0] and r.top_eigenvalue_converged
        assert r.top_eigenvalue == pytest.approx(top, rel=1e-4)
        assert abs(r.trace - float(block.trace())) <= 3 * r.trace_std_error


def test_train_mode_batchnorm_uses_batch_statistics_and_says_so():
    model, x, y = tiny_mlp(batchnorm=True)
    exact = torch.linalg.eigvalsh(dense_hessian(model, x, y, train_mode=True)).max().item()
    exact_eval = torch.linalg.eigvalsh(dense_hessian(model, x, y, train_mode=False)).max().item()
    assert abs(exact - exact_eval) > 1e-3 * exact   # the two modes really differ here
    for mode, value in [("train", exact), ("eval", exact_eval)]:
        result = cv.top_eigenvalues(model, [(x, y)], k=1, tol=1e-6, bn_mode=mode, generator=gen())
        assert result.bn_mode == mode and result.eigenvalues[0] == pytest.approx(value, rel=1e-4)
    with pytest.raises(ConfigError, match="bn_mode must be one of eval, train"):
        cv.hessian_trace(model, [(x, y)], bn_mode="frozen")


N_PARAMS_BN = 91  # tiny_mlp(batchnorm=True): 5*8+8 + 8+8 (BatchNorm) + 8*3+3
MEASUREMENTS = {
    "hvp": lambda m, b, mode: cv.hvp(m, b, torch.ones(N_PARAMS_BN), bn_mode=mode),
    "lanczos": lambda m, b, mode: cv.top_eigenvalues(m, b, k=2, generator=gen(), bn_mode=mode),
    "power": lambda m, b, mode: cv.top_eigenvalues(m, b, k=2, method="power", max_iter=20, generator=gen(),
                                                   bn_mode=mode),
    "trace": lambda m, b, mode: cv.hessian_trace(m, b, n_probes=3, generator=gen(), bn_mode=mode),
    "trace_rebuilt": lambda m, b, mode: cv.hessian_trace(m, b, n_probes=3, generator=gen(), bn_mode=mode,
                                                         graph_budget_bytes=0),
    "density": lambda m, b, mode: cv.spectral_density(m, b, n_probes=2, n_iter=5, generator=gen(), bn_mode=mode),
    "layers": lambda m, b, mode: cv.layer_curvature(m, b, n_probes=2, max_iter=5, generator=gen(), bn_mode=mode),
}


@pytest.mark.parametrize("name", list(MEASUREMENTS))
@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_model_and_rng_are_left_exactly_as_found(name, bn_mode):
    model, x, y = tiny_mlp(batchnorm=True, train_steps=5)   # left in train mode, BatchNorm buffers updated
    assert sum(p.numel() for p in model.parameters()) == N_PARAMS_BN
    model[0].weight.grad = torch.ones_like(model[0].weight)
    snapshot = Snapshot(model)
    MEASUREMENTS[name](model, batches_of(x, y, 16), bn_mode)
    snapshot.assert_unchanged()


def test_a_failing_measurement_still_restores_the_model():
    model, x, y = tiny_mlp(batchnorm=True, train_steps=5)
    snapshot = Snapshot(model)

    def broken_loss(logits, targets):
        raise RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        cv.hessian_trace(model, [(x, y)], n_probes=2, loss_fn=broken_loss, bn_mode="train")
    snapshot.assert_unchanged()


@requires_cuda
def test_cuda_matches_cpu(problem):
    model, x, y, _, eigenvalues = problem
    import copy
    gpu = copy.deepcopy(model).cuda()
    batches = batches_of(x.cuda(), y.cuda(), 32)
    result = cv.top_eigenvalues(gpu, batches, k=2, tol=1e-5, generator=torch.Generator("cuda").manual_seed(0))
    assert result.eigenvectors.is_cuda
    assert np.array(result.eigenvalues) == pytest.approx(eigenvalues[:2], rel=1e-4)
    trace = cv.hessian_trace(gpu, batches, n_probes=5, generator=gen())
    assert np.isfinite(trace.trace)
