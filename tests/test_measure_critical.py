"""measure.critical: the critical-batch fit against data generated from its own model."""
import math
import subprocess
import sys

import numpy as np
import pytest

from bsresearch.config import ConfigError
from bsresearch.measure.critical import fit_critical_batch, fit_critical_batch_examples


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
