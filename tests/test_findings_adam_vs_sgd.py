"""Adam vs momentum SGD: the tuned lr per optimizer, the two-stage points and the B_crit ratio, on made-up
steps-to-target tables with known answers."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml

from bsresearch.config import ConfigError
from bsresearch.findings.adam_vs_sgd import (
    compare_critical_batches,
    critical_batch_ratio,
    fittable,
    optimizer_fit,
    points_by_optimizer,
    seeds_overrides,
    tuned_by_optimizer,
)
from bsresearch.findings.verdict import Verdict
from bsresearch.measure.critical import CriticalBatchFit
from bsresearch.plots.findings.adam_vs_sgd import steps_by_optimizer

SIZES = (8, 32, 128, 512, 2048)
B_CRIT = {"adam": 400.0, "sgd": 100.0}
BEST_LR = {"adam": 0.001, "sgd": 0.05}


def steps(opt, b, seed, lr):
    """S_min (1 + B_crit/B) at the best lr, 1.5x at the other two lrs, a small per-seed factor."""
    exact = 100 * (1 + B_CRIT[opt] / b)
    return exact * (1.0 if lr == BEST_LR[opt] else 1.5) * (1 + 0.01 * (seed - 3))


def runs(seeds=(1, 2), second=(3, 4, 5), edge=False):
    """Selection seeds at three lrs (best in the middle, or at the top with edge), second-stage seeds at
    the best lr only."""
    rows = []
    for opt, lr in BEST_LR.items():
        lrs = (lr / 4, lr / 2, lr) if edge else (lr / 2, lr, lr * 2)
        for b in SIZES:
            for s in seeds:
                rows += [{"optimizer": opt, "batch_size": b, "lr": x, "seed": s, "state": "ok",
                          "steps_to_target": steps(opt, b, s, x), "examples_to_target": steps(opt, b, s, x) * b}
                         for x in lrs]
            rows += [{"optimizer": opt, "batch_size": b, "lr": lr, "seed": s, "state": "ok",
                      "steps_to_target": steps(opt, b, s, lr), "examples_to_target": steps(opt, b, s, lr) * b}
                     for s in second]
    return pd.DataFrame(rows)


def fit(b_crit, rel_se, n):
    return CriticalBatchFit(s_min=100, b_crit=b_crit, e_min=100 * b_crit, s_min_std_error=1,
                            b_crit_std_error=rel_se * b_crit, e_min_std_error=1, s_min_interval=(90, 110),
                            b_crit_interval=(b_crit * math.exp(-2 * rel_se), b_crit * math.exp(2 * rel_se)),
                            confidence=0.95, n_points=n, rms_log_residual=0.1)


def test_the_ratio_interval_is_welch_on_the_log_scale():
    # equal standard errors 0.1 and 10 residual dof each: nu = 20, half-width t(0.975, 20) sqrt(0.02)
    r = critical_batch_ratio(fit(400, 0.1, 12), fit(100, 0.1, 12))
    assert r.ratio == pytest.approx(4.0) and r.dof == pytest.approx(20.0)
    half = 2.0859634 * math.sqrt(0.02)
    assert (r.low, r.high) == pytest.approx((4 * math.exp(-half), 4 * math.exp(half)), rel=1e-6)
    assert not r.intervals_overlap and r.verdict == Verdict.REPRODUCED
    # unequal: nu = (0.01 + 0.04)^2 / (0.01^2/10 + 0.04^2/10) = 0.0025 / 0.00017
    r = critical_batch_ratio(fit(400, 0.1, 12), fit(100, 0.2, 12))
    assert r.dof == pytest.approx(0.0025 / 0.00017)


def test_the_verdict_follows_the_ratio_and_the_intervals():
    assert critical_batch_ratio(fit(150, 0.05, 25), fit(100, 0.05, 25)).verdict == Verdict.PARTLY   # 1.5x, significant
    overlap = critical_batch_ratio(fit(300, 0.2, 25), fit(100, 0.4, 25))
    assert overlap.intervals_overlap and overlap.low > 1 and overlap.verdict == Verdict.PARTLY
    same = critical_batch_ratio(fit(110, 0.1, 25), fit(100, 0.1, 25))
    assert same.verdict == Verdict.NOT_REPRODUCED and same.within_factor                     # Nado's reading
    smaller = critical_batch_ratio(fit(20, 0.1, 25), fit(100, 0.1, 25))
    assert smaller.verdict == Verdict.NOT_REPRODUCED and not smaller.within_factor
    assert critical_batch_ratio(fit(400, 0.1, 2), fit(100, 0.1, 25)).verdict == Verdict.NOT_TESTABLE  # no residual dof


def test_the_tuned_lr_is_chosen_per_optimizer_on_the_selection_seeds():
    table = runs()
    best = tuned_by_optimizer(table[table["seed"].isin([1, 2])])
    assert list(best.columns[:2]) == ["optimizer", "batch_size"] and len(best) == 2 * len(SIZES)
    assert all(best["lr"] == best["optimizer"].map(BEST_LR)) and best["interior"].all()
    text = seeds_overrides(best)
    overrides = yaml.safe_load(text)["overrides"]
    assert {"where": {"optimizer": "adam", "batch_size": 8}, "set": {"lr": 0.001}} in overrides
    assert len(overrides) == 2 * len(SIZES)


def test_points_by_optimizer_use_every_seed_at_the_best_lr_and_drop_thin_batch_sizes():
    table = runs()
    sel = table["seed"].isin([1, 2])
    best = tuned_by_optimizer(table[sel])
    miss = (table["optimizer"] == "sgd") & (table["batch_size"] == 8) & table["seed"].isin([3, 4, 5])
    table.loc[miss, "steps_to_target"] = np.nan   # 3 of 5 seeds never reached the target
    points = points_by_optimizer(table, best)
    assert len(points) == 2 * len(SIZES) * 5
    sgd8 = points[(points["optimizer"] == "sgd") & (points["batch_size"] == 8)]
    assert sgd8["n_reached"].eq(2).all() and not sgd8["in_fit"].any()
    assert points.loc[points["optimizer"] == "adam", "in_fit"].all()


def test_the_fits_recover_the_critical_batches_and_the_ratio():
    table = runs()
    best = tuned_by_optimizer(table[table["seed"].isin([1, 2])])
    points = points_by_optimizer(table, best)
    assert optimizer_fit(points, "adam").b_crit == pytest.approx(400, rel=1e-3)
    assert optimizer_fit(points, "sgd").b_crit == pytest.approx(100, rel=1e-3)
    test = compare_critical_batches(points, best)
    assert test.ratio == pytest.approx(4.0, rel=1e-3) and test.verdict == Verdict.REPRODUCED and not test.problems
    fig, ax = plt.subplots()
    steps_by_optimizer(ax, points, {"adam": optimizer_fit(points, "adam"), "sgd": optimizer_fit(points, "sgd")})
    assert len(ax.get_lines()) >= 4
    plt.close(fig)


def test_a_best_lr_on_the_grid_edge_makes_it_not_testable():
    table = runs(edge=True)
    best = tuned_by_optimizer(table[table["seed"].isin([1, 2])])
    test = compare_critical_batches(points_by_optimizer(table, best), best)
    assert test.verdict == Verdict.NOT_TESTABLE and "on the edge" in test.problems[0]


def test_missing_columns_are_one_clear_error():
    with pytest.raises(ConfigError, match="no column 'optimizer'"):
        tuned_by_optimizer(runs().drop(columns="optimizer"))


def test_before_the_second_stage_the_test_is_not_testable_without_an_error():
    table = runs(second=())                        # selection seeds only: 2 seeds < 3 per batch size
    best = tuned_by_optimizer(table)
    points = points_by_optimizer(table, best)
    assert not points["in_fit"].any() and fittable(points) == []
    test = compare_critical_batches(points, best)
    assert test.verdict == Verdict.NOT_TESTABLE and math.isnan(test.ratio)
    assert "0 batch sizes in the fit" in test.problems[0]
