"""noise.meter: NoiseMeter against the estimators it stands on (the two-batch formula and the EMA), fed by each of
its three sources, and against the two-batch estimate of a real model's micro-batches at the same weights."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bsresearch.noise.estimators import NoiseScaleEMA, micro_batch_estimate, two_batch_estimate, update_noise_ema
from bsresearch.noise.meter import ESTIMATORS, NoiseMeter

PAIRS = [(5.0, 1.5, 8, 64), (7.0, 1.2, 8, 64), (4.0, 1.9, 16, 64), (9.0, 1.0, 8, 64)]   # the last: |G|^2 < 0


def test_each_sample_is_the_two_batch_estimate_and_the_ema_the_estimators_ema():
    meter, ema = NoiseMeter(decay=0.8), NoiseScaleEMA(decay=0.8)
    samples = [meter.pair(*pair, step=i) for i, pair in enumerate(PAIRS)]
    for pair in PAIRS:
        ema = update_noise_ema(ema, *pair)
    assert meter.ema == ema and meter.b_simple == ema.b_simple
    assert len(samples) == len(PAIRS)
    for i, (sample, pair) in enumerate(zip(samples, PAIRS)):
        grad_sq, trace = two_batch_estimate(*pair)
        assert (sample.grad_sq_norm, sample.trace_cov) == (grad_sq, trace)
        assert sample.b_simple == (trace / grad_sq if grad_sq > 0 else math.inf)
        assert (sample.b_small, sample.b_big, sample.step, sample.estimator) == (pair[2], pair[3], i, "two_batch")
    assert samples[-1].b_simple == math.inf and math.isfinite(samples[-1].b_simple_ema)
    assert samples[-1].b_simple_ema == meter.b_simple and meter.last is samples[-1]
    assert list(samples[0].row()) == ["step", "b_simple", "b_simple_ema", "estimator", "grad_sq_norm", "trace_cov",
                                      "b_small", "b_big"]


def test_devices_and_micro_batches_are_the_same_estimator_named_by_their_source():
    by_pair, by_devices, by_micro = NoiseMeter(0.9), NoiseMeter(0.9), NoiseMeter(0.9)
    for small, big, b_small, b_big in PAIRS:
        a = by_pair.pair(small, big, b_small, b_big)
        b = by_devices.devices(small, big, b_small, b_big)
        c = by_micro.micro_batches([small], [b_small], big, b_big)
        assert (a.grad_sq_norm, a.trace_cov) == (b.grad_sq_norm, b.trace_cov) == (c.grad_sq_norm, c.trace_cov)
        assert (a.estimator, b.estimator, c.estimator) == ("two_batch", "devices", "micro_batch")
    assert by_pair.ema == by_devices.ema == by_micro.ema
    assert set(ESTIMATORS) == {"two_batch", "devices", "micro_batch"}


def test_several_micro_batches_give_the_mean_of_their_estimates_and_their_sizes_sum_to_the_batch():
    meter = NoiseMeter(0.5)
    sample = meter.micro_batches([4.0, 2.5, 3.0], [3, 5, 8], 1.5)   # b_big: the sum of the sizes, 16
    assert sample.b_big == 16 and sample.b_small == pytest.approx(16 / 3)
    assert (sample.grad_sq_norm, sample.trace_cov) == micro_batch_estimate([4.0, 2.5, 3.0], [3, 5, 8], 1.5, 16)
    assert meter.ema.n_samples == 1 and meter.ema.grad_sq_norm == pytest.approx(sample.grad_sq_norm, rel=1e-12)


def test_a_non_finite_step_is_a_nan_sample_that_the_ema_skips_and_bad_sizes_are_errors():
    meter = NoiseMeter(0.9)
    meter.pair(*PAIRS[0])
    before = meter.ema
    sample = meter.pair(math.inf, 1.0, 8, 64)   # a GradScaler's overflowed step
    assert math.isnan(sample.grad_sq_norm) and math.isnan(sample.b_simple) and meter.ema == before
    with pytest.raises(ValueError, match="< the big batch's 8"):
        meter.pair(1.0, 1.0, 8, 8)
    with pytest.raises(ValueError, match="one size per small batch"):
        meter.micro_batches([1.0, 2.0], [4], 1.0, 16)
    with pytest.raises(ValueError, match="estimator must be one of"):
        meter.pair(2.0, 1.0, 4, 8, estimator="ddp")
    with pytest.raises(ValueError, match="decay"):
        NoiseMeter(1.0)


def test_state_dict_resumes_the_ema_exactly():
    whole, first = NoiseMeter(0.7), NoiseMeter(0.7)
    for pair in PAIRS:
        whole.pair(*pair)
    for pair in PAIRS[:2]:
        first.pair(*pair)
    resumed = NoiseMeter(0.7)
    resumed.load_state_dict(first.state_dict())
    for pair in PAIRS[2:]:
        resumed.pair(*pair)
    assert resumed.ema == whole.ema


def test_micro_batches_of_a_real_model_match_the_two_batch_estimate_at_the_same_weights():
    """Oracle: gradient accumulation as a trainer runs it (each micro-batch's loss scaled by its share, .grad
    summed), each micro-batch's own gradient read as the difference of .grad, against two_batch_estimate of the
    same micro-batches' gradients computed alone at the same weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(24, 4), torch.randint(3, (24,))
    sizes = [4, 8, 12]
    own = []
    start = 0
    for b in sizes:   # accumulation: loss x share, .grad accumulates
        before = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
        (F.cross_entropy(model(x[start:start + b]), y[start:start + b]) * b / 24).backward()
        diff = [(p.grad - g) / (b / 24) for p, g in zip(model.parameters(), before)]   # undo the share
        own.append(float(sum((d.double() ** 2).sum() for d in diff)))
        start += b
    big = float(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
    sample = NoiseMeter(0.9).micro_batches(own, sizes, big)

    def alone(xs, ys):
        grads = torch.autograd.grad(F.cross_entropy(model(xs), ys), list(model.parameters()))
        return float(sum((g.double() ** 2).sum() for g in grads))
    bounds = [(0, 4), (4, 12), (12, 24)]
    pairs = [two_batch_estimate(alone(x[a:b], y[a:b]), alone(x, y), b - a, 24) for a, b in bounds]
    assert len(pairs) == len(sizes)
    assert sample.grad_sq_norm == pytest.approx(sum(p[0] for p in pairs) / 3, rel=1e-4)
    assert sample.trace_cov == pytest.approx(sum(p[1] for p in pairs) / 3, rel=1e-4)
