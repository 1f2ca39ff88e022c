"""measure.critical's two definitions of the critical batch size and its power law, against published numbers.

Source: Zhang, Zou, ..., Kakade 2025, "How Does Critical Batch Size Scale in Pre-training?", repository
hlzhang109/critical-batch-size, file plots/chinchilla.ipynb at commit c5b509d8cf276bb40388172a08f9d6f644cf44dc,
cell 5: the steps to each model's Chinchilla-optimal target loss (C4 validation, the runs' minimum over learning
rates and EWA decays) at batch 64 ... 16384 sequences of 512 tokens, and that cell's printed outputs: the fit
log S = log(a + b / B) per model, the critical batch size as the batch where the steps exceed linear scaling from
batch 256 by 20% (their fsolve of b - 5 a cbs + 5 a 1.2 256 = 0), and the power law of that CBS against the model
size in millions of parameters (curve_fit on log cbs). The numbers below are copied from there.
"""
import math

import numpy as np
import pytest

from bsresearch.config import ConfigError
from bsresearch.measure.critical import critical_batch_size, fit_power_law, held_out_power_law

BATCH_SIZES = [2 ** i for i in range(6, 15)]
STEPS = {   # cell 5's `results`
    85: [46000, 23000, 13282, 7000, 3840, 2528, 1917, 1600, 1600],
    151: [96000, 49000, 24000, 12000, 7128, 4350, 2940, 2400, 2300],
    302: [196000, 90000, 46000, 23400, 13300, 7224, 4980, 3400, 2879],
    604: [311000, 166000, 81000, 37440, 21320, 11400, 7199, 4700, 3800],
    1200: [642000, 331000, 176000, 94000, 46500, 25000, 15360, 8900, 6500],
}
PRINTED_FIT = {   # cell 5's printed a (S_min) and b (S_min x McCandlish's B_crit)
    85: (1293.8268694659337, 2834258.0888740215), 151: (1752.4211962796799, 5677478.783007255),
    302: (2095.3497601960876, 11383269.891870424), 604: (2459.9274969089824, 19449688.58779496),
    1200: (3897.306597333535, 43381130.22429582),
}
PRINTED_CBS = {85: 745.3201466381583, 151: 955.1582414387951, 302: 1393.726947253441, 604: 1888.5221009346358,
               1200: 2533.4108017868743}
PRINTED_POWER_LAW = (93.196814043949, 0.4682782328130422)   # cbs = 93.197 x model_size^0.468 (cell 7)


@pytest.mark.parametrize("model", sorted(STEPS))
def test_both_definitions_reproduce_the_published_fit(model):
    mccandlish = critical_batch_size(BATCH_SIZES, STEPS[model])
    a, b = PRINTED_FIT[model]
    assert mccandlish.fit.s_min == pytest.approx(a, rel=1e-6)
    assert mccandlish.batch_size == pytest.approx(b / a, rel=1e-6)
    low, high = mccandlish.interval
    assert low < mccandlish.batch_size < high and math.isfinite(high)
    excess = critical_batch_size(BATCH_SIZES, STEPS[model], definition="excess", reference_batch=256)
    assert excess.batch_size == pytest.approx(PRINTED_CBS[model], rel=1e-6)
    # the definition itself, on the fitted curve: the steps at the CBS are 1.2x linear scaling from batch 256
    fit = excess.fit
    linear = fit.predict_steps(256) * 256 / excess.batch_size
    assert fit.predict_steps(excess.batch_size) == pytest.approx(1.2 * linear, rel=1e-9)
    # its interval is B_crit's mapped through B = 1.2 x 256 + 0.2 B_crit
    assert excess.interval == pytest.approx((1.2 * 256 + 0.2 * low, 1.2 * 256 + 0.2 * high))


def test_the_power_law_of_the_cbs_against_model_size_reproduces_the_published_one():
    models = sorted(STEPS)
    cbs = [critical_batch_size(BATCH_SIZES, STEPS[m], "excess", reference_batch=256).batch_size for m in models]
    law = fit_power_law(cbs, {"params": models})
    assert law.coefficient == pytest.approx(PRINTED_POWER_LAW[0], rel=1e-5)
    assert law.exponents["params"] == pytest.approx(PRINTED_POWER_LAW[1], rel=1e-5)
    low, high = law.exponent_intervals["params"]
    assert low < PRINTED_POWER_LAW[1] < high and high - low < 0.2


def test_a_held_out_model_is_predicted_within_its_interval():
    """Fit on 85M ... 604M and predict the 1.2B model's CBS (an extrapolation by 2x in size); the published
    CBS at 1.2B (2533) lies inside the prediction interval, and a CBS 1.5x larger would not."""
    models = sorted(STEPS)
    cbs = [critical_batch_size(BATCH_SIZES, STEPS[m], "excess", reference_batch=256).batch_size for m in models]
    held = held_out_power_law(cbs, {"params": models})
    assert held.observed == pytest.approx(PRINTED_CBS[1200], rel=1e-6) and held.inside
    assert abs(held.log_error) < 0.1
    assert not held_out_power_law(cbs[:-1] + [1.5 * cbs[-1]], {"params": models}).inside


def test_a_power_law_in_two_features_recovers_both_exponents_of_its_own_model():
    rng = np.random.default_rng(0)
    data = np.exp(rng.uniform(0, 6, 40))
    params = np.exp(rng.uniform(0, 4, 40))
    y = 3.0 * data ** 0.5 * params ** 0.2 * np.exp(rng.normal(0, 0.05, 40))
    law = fit_power_law(y, {"data": data, "params": params})
    for name, truth in (("data", 0.5), ("params", 0.2)):
        low, high = law.exponent_intervals[name]
        assert low < truth < high and high - low < 0.05
    value, low, high = law.predict(data=10.0, params=5.0)
    assert low < 3.0 * 10 ** 0.5 * 5 ** 0.2 < high and value == pytest.approx(3.0 * 10 ** 0.5 * 5 ** 0.2, rel=0.05)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ConfigError, match="definition must be one of mccandlish, excess"):
        critical_batch_size(BATCH_SIZES, STEPS[85], definition="zhang")
    with pytest.raises(ConfigError, match="excess must be a fraction > 0"):
        critical_batch_size(BATCH_SIZES, STEPS[85], definition="excess", excess=0)
    with pytest.raises(ConfigError, match="collinear"):
        fit_power_law([1.0, 2.0, 4.0], {"data": [1.0, 2.0, 4.0], "tokens": [2.0, 4.0, 8.0]})
    with pytest.raises(ConfigError, match="positive finite"):
        fit_power_law([1.0, -2.0, 4.0], {"data": [1.0, 2.0, 4.0]})
    with pytest.raises(ConfigError, match="exactly the features data"):
        fit_power_law([1.0, 2.0, 4.0], {"data": [1.0, 2.0, 4.0]}).predict(params=3.0)
