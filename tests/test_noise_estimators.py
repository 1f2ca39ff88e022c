"""noise.estimators: the two-batch formula on exact expectations, its mean over micro-batches, the EMA's bias
correction and ratio of averages; and the package's lazy names."""
import importlib
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import bsresearch.noise as noise_package
from bsresearch.noise import estimators


def test_two_batch_estimate_is_exact_on_exact_expectations():
    grad_sq, trace = 2.0, 300.0
    for b_small, b_big in [(1, 2), (8, 512), (100, 1000)]:
        est = estimators.two_batch_estimate(grad_sq + trace / b_small, grad_sq + trace / b_big, b_small, b_big)
        assert est == pytest.approx((grad_sq, trace), rel=1e-12)


def test_ema_bias_correction_and_ratio_of_averages():
    ema = estimators.NoiseScaleEMA(decay=0.9)
    assert math.isnan(ema.b_simple)
    pairs = [(5.0, 1.5), (7.0, 1.2), (4.0, 1.9)]
    for small, big in pairs:
        ema = estimators.update_noise_ema(ema, small, big, 8, 64)
    estimates = [estimators.two_batch_estimate(s, b, 8, 64) for s, b in pairs]
    weights = np.array([0.9 ** 2, 0.9, 1.0]) * 0.1 / (1 - 0.9 ** 3)
    assert ema.grad_sq_norm == pytest.approx(sum(w * e[0] for w, e in zip(weights, estimates)), rel=1e-12)
    assert ema.trace_cov == pytest.approx(sum(w * e[1] for w, e in zip(weights, estimates)), rel=1e-12)
    assert ema.b_simple == pytest.approx(ema.trace_cov / ema.grad_sq_norm)
    assert estimators.update_noise_ema(ema, math.inf, 1.0, 8, 64) == ema   # a non-finite sample is skipped


def test_the_mean_over_micro_batches_is_exact_on_exact_expectations_and_one_micro_batch_is_the_pair():
    grad_sq, trace = 2.0, 300.0
    sizes, big = [3, 5, 8], 16   # micro-batches of different sizes (token counts) of one batch of 16
    est = estimators.micro_batch_estimate([grad_sq + trace / b for b in sizes], sizes, grad_sq + trace / big, big)
    assert est == pytest.approx((grad_sq, trace), rel=1e-12)
    pairs = [estimators.two_batch_estimate(s, 1.5, b, 16) for s, b in [(4.0, 3), (2.5, 5)]]
    assert estimators.micro_batch_estimate([4.0, 2.5], [3, 5], 1.5, 16) == pytest.approx(
        (np.mean([p[0] for p in pairs]), np.mean([p[1] for p in pairs])), rel=1e-15)
    # one small batch: the two-batch estimate itself, bit for bit (the training loop's samples depend on it)
    assert estimators.micro_batch_estimate([4.0], [3], 1.5, 16) == estimators.two_batch_estimate(4.0, 1.5, 3, 16)
    with pytest.raises(ValueError, match="one size per small batch"):
        estimators.micro_batch_estimate([4.0, 2.5], [3], 1.5, 16)


def test_squared_grad_norm_sums_every_gradient_and_skips_missing_ones():
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    assert float(estimators.squared_grad_norm(model)) == 0.0   # no gradient yet
    model(torch.randn(5, 3)).pow(2).sum().backward()
    model[0].bias.grad = None
    expected = sum(float((p.grad.double() ** 2).sum()) for p in model.parameters() if p.grad is not None)
    assert float(estimators.squared_grad_norm(model)) == pytest.approx(expected, rel=1e-6)


def test_history_columns_are_nan_before_the_first_sample_then_the_emas():
    assert all(math.isnan(v) for v in estimators.noise_ema_columns(None).values())
    ema = estimators.update_noise_ema(estimators.NoiseScaleEMA(0.9), 5.0, 1.5, 8, 64)
    assert estimators.noise_ema_columns(ema) == {"noise_b_simple_ema": ema.b_simple,
                                                 "noise_grad_sq_norm_ema": ema.grad_sq_norm,
                                                 "noise_trace_cov_ema": ema.trace_cov}


def test_the_package_names_every_public_name_once_and_loads_its_modules_on_first_access():
    code = ("import sys, bsresearch.noise; "
            "assert not [m for m in sys.modules if m.startswith('bsresearch.noise.')], 'a module was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert len(noise_package.__all__) == len(set(noise_package.__all__))
    for name in noise_package.__all__:   # each defined in the module that the package names for it
        module = importlib.import_module(f"bsresearch.noise.{noise_package._WHERE[name]}")
        value = getattr(noise_package, name)
        assert value is getattr(module, name)
        assert getattr(value, "__module__", module.__name__) == module.__name__, name
    with pytest.raises(AttributeError, match="has no attribute 'NoiseScaleCallback'"):
        noise_package.NoiseScaleCallback  # noqa: B018
