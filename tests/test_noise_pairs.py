"""noise.pairs: the two-batch estimator on a trained model against the exact per-example value and a known
noise, its draws and their summary, and small_batch_sq_norm against a hand-written backward pass."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from measure_oracles import Snapshot, quadratic_loss, tiny_mlp
from test_noise_exact import gen, known_noise_problem

from bsresearch.noise import pairs
from bsresearch.noise.estimators import two_batch_estimate
from bsresearch.noise.exact import gradient_noise_scale


def test_two_batch_estimator_recovers_the_exact_value():
    model, x, y, truth = known_noise_problem(n=20_000)
    exact = gradient_noise_scale(model, x, y, chunk_size=4096, unbiased=False, loss_fn=quadratic_loss)
    result = pairs.two_batch_noise_scale(model, x, y, b_small=4, b_big=256, n_draws=400, generator=gen(),
                                         loss_fn=quadratic_loss)
    assert result.n_draws == 400 and result.replacement
    # with replacement both estimates are unbiased for the data set's statistics (tr Sigma with 1/N)
    assert result.trace_cov == pytest.approx(exact.trace_cov, rel=0.05)
    assert result.grad_sq_norm == pytest.approx(exact.grad_sq_norm, rel=0.15)
    assert result.b_simple == pytest.approx(exact.b_simple, rel=0.15)
    assert result.b_simple == pytest.approx(truth["b_simple"], rel=0.2)
    # the ratio is taken after averaging
    grad_sq, trace = two_batch_estimate(result.sq_norm_small, result.sq_norm_big, 4, 256)
    assert result.b_simple == pytest.approx(trace / grad_sq, rel=1e-12)


def test_two_batch_arguments_are_checked():
    model, x, y = tiny_mlp(train_steps=0)
    with pytest.raises(ValueError, match="b_small < b_big"):
        pairs.two_batch_noise_scale(model, x, y, 8, 8)
    with pytest.raises(ValueError, match="exceeds"):
        pairs.two_batch_noise_scale(model, x, y, 8, 128, replacement=False)


def test_model_and_rng_are_left_exactly_as_found():
    model, x, y = tiny_mlp(batchnorm=True, train_steps=5)
    snapshot = Snapshot(model)
    pairs.two_batch_noise_scale(model, x, y, 4, 16, n_draws=3, generator=gen(), bn_mode="train")
    snapshot.assert_unchanged()


def test_pairs_are_the_draws_of_two_batch_noise_scale_and_the_summary_their_ratio_of_averages():
    """Oracle: two_batch_noise_scale with one draw, from the same generator stream, pair by pair; the summary's
    B_simple is mean tr(Sigma) / mean |G|^2 of those pairs."""
    model, x, y = tiny_mlp(train_steps=5)
    table = pairs.two_batch_pairs(model, x, y, 4, 16, n_pairs=6, generator=gen(3))
    g = gen(3)
    draws = [pairs.two_batch_noise_scale(model, x, y, 4, 16, n_draws=1, generator=g) for _ in range(6)]
    assert len(table) == len(draws) == 6
    assert table["sq_norm_small"].tolist() == [d.sq_norm_small for d in draws]
    assert table["sq_norm_big"].tolist() == [d.sq_norm_big for d in draws]
    assert table["grad_sq_norm"].tolist() == [d.grad_sq_norm for d in draws]
    summary = pairs.two_batch_summary(table, n_bootstrap=200, seed=1)
    mean_trace = float(np.mean([d.trace_cov for d in draws]))
    mean_grad_sq = float(np.mean([d.grad_sq_norm for d in draws]))
    assert summary["n_pairs"] == 6 and summary["trace_cov"] == pytest.approx(mean_trace, rel=1e-12)
    expected = mean_trace / mean_grad_sq if mean_grad_sq > 0 else np.inf
    assert summary["b_simple"] == pytest.approx(expected, rel=1e-12)
    assert summary["low"] <= summary["high"]


def test_small_batch_sq_norm_is_the_gradients_norm_and_leaves_the_loop_alone():
    """Oracle: zero_grad, backward and the sum of |p.grad|^2 on a twin model; the measured model's .grad, its
    BatchNorm buffers and the global random stream (dropout) are as they were."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    model.eval()   # no dropout and the running statistics: the twin's backward pass is the same function
    twin = copy.deepcopy(model)
    x, y = torch.randn(10, 6, generator=gen(1)), torch.randint(3, (10,), generator=gen(2))
    F.cross_entropy(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    value = pairs.small_batch_sq_norm(model, lambda xs, ys: F.cross_entropy(model(xs), ys), x[:4], y[:4])
    F.cross_entropy(twin(x[:4]), y[:4]).backward()
    assert value == pytest.approx(float(sum((p.grad ** 2).sum() for p in twin.parameters())), rel=1e-6)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    # in train mode: the buffers are put back and the random stream does not move
    model.train()
    buffers = [b.clone() for b in model.buffers()]
    torch.manual_seed(5)
    pairs.small_batch_sq_norm(model, lambda xs, ys: F.cross_entropy(model(xs), ys), x, y)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))
    assert all(torch.equal(b, c) for b, c in zip(model.buffers(), buffers))
