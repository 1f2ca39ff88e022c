"""Gradient noise scale against an explicit per-example loop, a problem with known gradient noise,
and the critical-batch fit against data generated from its own model."""
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import killed_at, requires_cuda, tiny_config
from measure_oracles import Shift, Snapshot, dense_hessian, per_example_loop, quadratic_loss, tiny_mlp

from bsresearch import noise_tracker
from bsresearch.config import ConfigError, RunConfig
from bsresearch.data import load_dataset
from bsresearch.engine import train_next_batch
from bsresearch.measure import noise
from bsresearch.measure.critical import fit_critical_batch, fit_critical_batch_examples
from bsresearch.measure.functional import layer_slices
from bsresearch.noise.meter import NoiseMeter
from bsresearch.noise.microbatch import micro_batch_hooks
from bsresearch.rundir import RunDir
from bsresearch.state import new_state
from bsresearch.train import run


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
    assert torch.allclose(noise.per_example_gradients(model, x, y).double(), loop, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("chunk_size", [7, 64])
def test_exact_statistics_equal_the_explicit_loop(problem, unbiased, chunk_size):
    model, x, y, loop = problem
    result = noise.gradient_noise_scale(model, x, y, chunk_size=chunk_size, unbiased=unbiased, per_layer=True)
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
    result = noise.gradient_noise_scale(model, x, y, unbiased=False, n_bootstrap=300, generator=gen(5))
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
    result = noise.gradient_noise_scale(model, x, y, loss_fn=quadratic_loss)
    assert result.grad_sq_norm < 0 and result.b_simple == math.inf
    assert noise.gradient_noise_scale(model, x, y, loss_fn=quadratic_loss, unbiased=False).b_simple > 1e6


def test_exact_statistics_recover_a_known_gradient_noise():
    model, x, y, truth = known_noise_problem(n=20_000)
    result = noise.gradient_noise_scale(model, x, y, chunk_size=4096, loss_fn=quadratic_loss)
    assert result.trace_cov == pytest.approx(truth["trace_cov"], rel=0.03)
    assert result.grad_sq_norm == pytest.approx(truth["grad_sq_norm"], rel=0.1)
    assert result.b_simple == pytest.approx(truth["b_simple"], rel=0.1)


def test_two_batch_estimator_recovers_the_exact_value():
    model, x, y, truth = known_noise_problem(n=20_000)
    exact = noise.gradient_noise_scale(model, x, y, chunk_size=4096, unbiased=False, loss_fn=quadratic_loss)
    result = noise.two_batch_noise_scale(model, x, y, b_small=4, b_big=256, n_draws=400, generator=gen(),
                                         loss_fn=quadratic_loss)
    assert result.n_draws == 400 and result.replacement
    # with replacement both estimates are unbiased for the data set's statistics (tr Sigma with 1/N)
    assert result.trace_cov == pytest.approx(exact.trace_cov, rel=0.05)
    assert result.grad_sq_norm == pytest.approx(exact.grad_sq_norm, rel=0.15)
    assert result.b_simple == pytest.approx(exact.b_simple, rel=0.15)
    assert result.b_simple == pytest.approx(truth["b_simple"], rel=0.2)
    # the ratio is taken after averaging
    grad_sq, trace = noise.two_batch_estimate(result.sq_norm_small, result.sq_norm_big, 4, 256)
    assert result.b_simple == pytest.approx(trace / grad_sq, rel=1e-12)


def test_two_batch_estimate_is_exact_on_exact_expectations():
    grad_sq, trace = 2.0, 300.0
    for b_small, b_big in [(1, 2), (8, 512), (100, 1000)]:
        est = noise.two_batch_estimate(grad_sq + trace / b_small, grad_sq + trace / b_big, b_small, b_big)
        assert est == pytest.approx((grad_sq, trace), rel=1e-12)


def test_two_batch_arguments_are_checked():
    model, x, y = tiny_mlp(train_steps=0)
    with pytest.raises(ValueError, match="b_small < b_big"):
        noise.two_batch_noise_scale(model, x, y, 8, 8)
    with pytest.raises(ValueError, match="exceeds"):
        noise.two_batch_noise_scale(model, x, y, 8, 128, replacement=False)


def test_ema_bias_correction_and_ratio_of_averages():
    ema = noise_tracker.NoiseScaleEMA(decay=0.9)
    assert math.isnan(ema.b_simple)
    pairs = [(5.0, 1.5), (7.0, 1.2), (4.0, 1.9)]
    for small, big in pairs:
        ema = noise_tracker.update_noise_ema(ema, small, big, 8, 64)
    estimates = [noise.two_batch_estimate(s, b, 8, 64) for s, b in pairs]
    weights = np.array([0.9 ** 2, 0.9, 1.0]) * 0.1 / (1 - 0.9 ** 3)
    assert ema.grad_sq_norm == pytest.approx(sum(w * e[0] for w, e in zip(weights, estimates)), rel=1e-12)
    assert ema.trace_cov == pytest.approx(sum(w * e[1] for w, e in zip(weights, estimates)), rel=1e-12)
    assert ema.b_simple == pytest.approx(ema.trace_cov / ema.grad_sq_norm)
    assert noise_tracker.update_noise_ema(ema, math.inf, 1.0, 8, 64) == ema   # a non-finite sample is skipped


def test_training_hook_feeds_the_ema_from_a_steps_micro_batches():
    """Oracle: the first micro-batch's and the whole batch's gradients computed by hand at the same weights."""
    cfg = tiny_config(batch_size=32, micro_batch_size=8, noise_scale_every=1, momentum=0.0)
    data = load_dataset("synthetic", train_size=256)
    state = new_state(cfg, data, torch.device("cpu"))
    twin = new_state(cfg, data, torch.device("cpu"))   # same seed: same weights and the same batch
    meter = NoiseMeter(cfg.noise_scale_ema)
    train_next_batch(state, cfg, data, lr=0.0, hooks=micro_batch_hooks(cfg, state, meter))
    idx = twin.sampler.next()

    def sq_norm(index):
        twin.model.zero_grad()
        torch.nn.functional.cross_entropy(twin.model(data.x_train[index]), data.y_train[index]).backward()
        return float(sum((p.grad ** 2).sum() for p in twin.model.parameters()))
    grad_sq, trace = noise.two_batch_estimate(sq_norm(idx[:8]), sq_norm(idx), 8, 32)
    assert meter.ema.n_samples == 1
    assert meter.ema.grad_sq_norm == pytest.approx(grad_sq, rel=1e-4)
    assert meter.ema.trace_cov == pytest.approx(trace, rel=1e-4)


def test_training_records_the_ema_columns_and_resumes_them(tmp_path):
    cfg = tiny_config(batch_size=32, micro_batch_size=8, noise_scale_every=2, checkpoint_every=10)
    result = run(cfg, tmp_path / "r")
    first, last = result.history[0], result.history[-1]
    assert math.isnan(first["noise_b_simple_ema"])          # no sample before the first step
    assert last["noise_b_simple_ema"] > 0 and last["noise_trace_cov_ema"] > 0
    # killed after the checkpoint at step 10 and resumed: the EMA (the callback's checkpointed state)
    # continues exactly, so every later row is the uninterrupted run's
    with killed_at(15):
        run(cfg, tmp_path / "killed")
    resumed = run(cfg, tmp_path / "killed")
    assert RunDir(tmp_path / "killed").status()["resumed_from"] == 10
    columns = ["step", "noise_b_simple_ema", "noise_grad_sq_norm_ema", "noise_trace_cov_ema", "train_loss"]
    def rows(history):   # past step 0, whose EMA is NaN (no sample yet)
        return [[r[c] for c in columns] for r in history if r["step"] > 0]
    assert len(rows(result.history)) > 2 and rows(resumed.history) == rows(result.history)
    assert "noise_b_simple_ema" not in run(tiny_config(), tmp_path / "plain").history[-1]


@pytest.mark.parametrize("changes,message", [
    ({"noise_scale_every": 5}, "noise_scale_every needs at least 2 micro-batches"),
    ({"noise_scale_every": 5, "micro_batch_size": 32}, "noise_scale_every needs at least 2 micro-batches"),
    ({"noise_scale_every": -1, "micro_batch_size": 8}, "noise_scale_every must be a non-negative"),
    ({"noise_scale_ema": 1.0}, "noise_scale_ema must be in [0, 1)"),
])
def test_noise_scale_config_is_validated(changes, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        RunConfig(batch_size=32, **changes)


def test_b_noise_against_the_dense_hessian(problem):
    model, x, y, loop = problem
    hessian = dense_hessian(model, x, y)
    deviations = loop - loop.mean(0)
    exact_trace = float(torch.einsum("ip,pq,iq->", deviations, hessian, deviations)) / (len(x) - 1)
    mean = loop.mean(0)
    exact_ghg = float(mean @ hessian @ mean)
    result = noise.hessian_noise_scale(model, x, y, n_probes=100, chunk_size=20, generator=gen())
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


@pytest.mark.parametrize("name", ["exact", "bootstrap", "two_batch", "b_noise"])
def test_model_and_rng_are_left_exactly_as_found(name):
    model, x, y = tiny_mlp(batchnorm=True, train_steps=5)
    snapshot = Snapshot(model)
    {"exact": lambda: noise.gradient_noise_scale(model, x, y, per_layer=True),
     "bootstrap": lambda: noise.gradient_noise_scale(model, x, y, n_bootstrap=10, generator=gen()),
     "two_batch": lambda: noise.two_batch_noise_scale(model, x, y, 4, 16, n_draws=3, generator=gen(), bn_mode="train"),
     "b_noise": lambda: noise.hessian_noise_scale(model, x, y, n_probes=2, generator=gen())}[name]()
    snapshot.assert_unchanged()


# ----------------------------------------------------------------------------- critical batch size
def test_critical_batch_fit_recovers_its_own_model():
    b = np.array([8, 16, 32, 64, 128, 256, 512, 1024])
    steps = 300 * (1 + 150 / b)
    fit = fit_critical_batch(b, steps)
    assert fit.s_min == pytest.approx(300, rel=1e-6) and fit.b_crit == pytest.approx(150, rel=1e-6)
    assert fit.e_min == pytest.approx(300 * 150, rel=1e-6) and fit.rms_log_residual < 1e-8
    assert fit.predict_steps(64) == pytest.approx(300 * (1 + 150 / 64))
    same = fit_critical_batch_examples(b, steps * b)
    assert same.b_crit == pytest.approx(fit.b_crit, rel=1e-6) and same.e_min == pytest.approx(fit.e_min, rel=1e-6)
    assert same.predict_examples(64) == pytest.approx(steps[3] * 64, rel=1e-6)


def test_critical_batch_intervals_cover_the_truth_under_noise():
    b = np.array([8, 16, 32, 64, 128, 256, 512, 1024, 2048])
    covered, estimates, std_errors = [], [], []
    for seed in range(40):
        steps = 300 * (1 + 150 / b) * np.exp(np.random.default_rng(seed).normal(0, 0.1, len(b)))
        fit = fit_critical_batch(b, steps)
        covered.append(fit.b_crit_interval[0] <= 150 <= fit.b_crit_interval[1])
        estimates.append(fit.b_crit)
        std_errors.append(fit.b_crit_std_error)
        assert fit.s_min_std_error > 0
    assert np.mean(covered) >= 0.8   # a 95% interval: about 38 of 40
    # ... and not by being too wide: the reported standard error matches the spread of the estimates
    assert 0.67 <= np.mean(std_errors) / np.std(estimates, ddof=1) <= 1.5


def test_critical_batch_fit_rejects_unusable_data():
    with pytest.raises(ConfigError, match="at least 2 distinct batch sizes"):
        fit_critical_batch([32, 32], [10, 12])
    with pytest.raises(ConfigError, match="positive finite"):
        fit_critical_batch([32, 64, 128], [10, float("nan"), 5])
    two = fit_critical_batch([10, 100], [300, 120])   # exact with two points, no error bar
    assert two.b_crit == pytest.approx(20) and math.isnan(two.b_crit_std_error)


def test_critical_batch_interval_the_data_cannot_bound_is_inf_not_an_error():
    # steps fall at least as fast as 1/B at every batch size measured (a small noisy quadratic model, preconditioned
    # with momentum, batch 1-16): B_crit runs to the fit's bound far above the data and its interval has no
    # upper end; the fit reports that (inf) instead of raising OverflowError
    b = np.array([1, 2, 4, 8, 16])
    fit = fit_critical_batch(b, [2407, 1121, 606, 333, 136])
    assert fit.b_crit > 1e3 * b.max() and fit.b_crit_interval[1] == math.inf
    assert 0 <= fit.b_crit_interval[0] < fit.b_crit and fit.s_min_interval[0] >= 0


def test_critical_module_does_not_import_torch():
    code = "import sys, bsresearch.measure.critical; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@requires_cuda
def test_cuda_noise_scale_matches_cpu(problem):
    model, x, y, loop = problem
    import copy
    gpu = copy.deepcopy(model).cuda()
    result = noise.gradient_noise_scale(gpu, x.cuda(), y.cuda(), n_bootstrap=20,
                                        generator=torch.Generator("cuda").manual_seed(0))
    assert result.b_simple == pytest.approx(loop_statistics(loop, True)["b_simple"], rel=1e-3)
    two = noise.two_batch_noise_scale(gpu, x.cuda(), y.cuda(), 4, 32, n_draws=5,
                                      generator=torch.Generator("cuda").manual_seed(0))
    assert np.isfinite(two.trace_cov)
