"""Steps-to-target analysis and figures (bsresearch.findings.steps_to_target), on known answers.

Oracles: steps generated from S_min (1 + B_crit/B) give back B_crit; a best lr put at a known place is
found, and flagged when on the grid's edge; t-intervals equal scipy's; the fitted curve's exponent is 0.8
and 0.2 at the regime boundaries; log-log interpolation of a power law is exact. No training here.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from bsresearch.config import ConfigError
from bsresearch.findings.steps_to_target import (
    REGIMES,
    CriticalBatchTest,
    add_confirmation_seeds,
    at_best_lr,
    b_crit_by_target,
    critical_batch_fits,
    critical_batch_test,
    exponent_regime,
    fit_points,
    fit_tuned_lr,
    largest_batch_fraction,
    local_exponents,
    lr_chosen_elsewhere,
    noise_checkpoints,
    noise_ratio_test,
    regime_boundaries,
    regime_of,
    steps_at_targets,
    tuned_table,
    value_at_loss,
)
from bsresearch.findings.verdict import Verdict
from bsresearch.measure.critical import fit_critical_batch
from bsresearch.noise.pairs import two_batch_pairs, two_batch_summary
from bsresearch.plots.findings.steps_to_target import (
    b_crit_vs_target,
    examples_vs_batch,
    mark_regimes,
    noise_at_target_vs_batch,
    noise_vs_training,
    regime_legend_text,
    steps_vs_batch,
    steps_vs_lr,
    tuned_lr_vs_batch,
    two_batch_vs_exact,
)

S_MIN, B_CRIT = 400.0, 50.0
SIZES = [4, 16, 64, 256, 1024]
LRS = [0.05, 0.1, 0.2, 0.4, 0.8]


def best_lr_of(b: float) -> float:
    """The lr each batch size is built to prefer: 0.1 at B <= 16, 0.2 at 64, 0.4 above (all interior)."""
    return 0.1 if b <= 16 else 0.2 if b == 64 else 0.4


def make_runs(noise: float = 0.05, seeds=(1, 2, 3)) -> pd.DataFrame:
    """A target-budget sweep: steps = S_min (1 + B_crit/B) x (1 + 0.5 log2(lr/best)^2) x seed noise; at lr
    0.8 batch 4 diverges (no steps)."""
    rng = np.random.default_rng(0)
    rows = []
    for b in SIZES:
        for lr in LRS:
            for seed in seeds:
                penalty = 1 + 0.5 * math.log2(lr / best_lr_of(b)) ** 2
                steps = S_MIN * (1 + B_CRIT / b) * penalty * math.exp(noise * rng.standard_normal())
                diverged = b == 4 and lr == 0.8
                rows.append({"sweep": "toy", "batch_size": b, "lr": lr, "seed": seed,
                             "state": "diverged" if diverged else "ok", "budget": "target", "target_loss": 0.3,
                             "max_steps": 20000, "budget_amount": 20.0, "git_commit": "c0ffee",
                             "steps_to_target": None if diverged else steps,
                             "examples_to_target": None if diverged else steps * b})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- tuned lr and the fit
def test_tuned_table_finds_the_best_lr_and_the_t_interval_at_it():
    runs = make_runs()
    table = tuned_table(runs)
    assert list(table["batch_size"]) == SIZES
    assert list(table["lr"]) == [best_lr_of(b) for b in SIZES]
    assert table["interior"].all()
    assert (table["n_lrs"] == 5).all() and (table["n_seeds"] == 3).all() and (table["n_reached"] == 3).all()
    assert (table["lr_min"] == 0.05).all() and (table["lr_max"] == 0.8).all()
    for _, row in table.iterrows():  # oracle: mean and t-interval of the three seeds at the best lr
        steps = runs[(runs.batch_size == row.batch_size) & (runs.lr == row.lr)]["steps_to_target"].to_numpy(float)
        half = stats.t.ppf(0.975, 2) * steps.std(ddof=1) / math.sqrt(3)
        assert row.steps_mean == pytest.approx(steps.mean())
        assert (row.steps_low, row.steps_high) == pytest.approx((steps.mean() - half, steps.mean() + half))
        assert row.examples_mean == pytest.approx(steps.mean() * row.batch_size)


def test_a_best_lr_on_the_grid_edge_is_flagged_and_failures_count_as_worst():
    runs = make_runs(noise=0.0)
    edge = runs[~((runs.batch_size == 1024) & (runs.lr == 0.8))]   # 1024's best (0.4) is now its largest lr
    table = tuned_table(edge).set_index("batch_size")
    assert not table.loc[1024, "interior"] and table.loc[1024, "lr"] == 0.4
    # a seed that fails at the otherwise best lr pushes the choice to the next lr
    failing = runs.copy()
    failing.loc[(failing.batch_size == 64) & (failing.lr == 0.2) & (failing.seed == 1), "steps_to_target"] = None
    assert tuned_table(failing).set_index("batch_size").loc[64, "lr"] != 0.2


def test_at_best_lr_keeps_every_seed_of_the_chosen_lr_only():
    runs = make_runs()
    per_seed = at_best_lr(runs, tuned_table(runs))
    assert len(per_seed) == len(SIZES) * 3
    assert all(lr == best_lr_of(b) for b, lr in zip(per_seed["batch_size"], per_seed["lr"]))


def test_critical_batch_fits_recover_b_crit():
    exact = at_best_lr(make_runs(noise=0.0), tuned_table(make_runs(noise=0.0)))
    fits = critical_batch_fits(exact).set_index("fit")
    assert list(fits.index) == ["all seeds", "seed mean", "seed 1", "seed 2", "seed 3"]
    assert np.allclose(fits["b_crit"], B_CRIT, rtol=1e-6) and np.allclose(fits["s_min"], S_MIN, rtol=1e-6)
    assert np.allclose(fits["e_min"], S_MIN * B_CRIT, rtol=1e-6)
    noisy = at_best_lr(make_runs(noise=0.05), tuned_table(make_runs(noise=0.05)))
    row = critical_batch_fits(noisy).set_index("fit").loc["all seeds"]
    assert row.n_points == 15 and row.b_crit_low < B_CRIT < row.b_crit_high
    assert row.b_crit_low < row.b_crit < row.b_crit_high
    with pytest.raises(ConfigError, match="2 or more batch sizes"):
        critical_batch_fits(noisy[noisy.batch_size == 4])


# ----------------------------------------------------------------------------- the two-stage design and the tests
def test_confirmation_seeds_join_at_the_best_lr_and_a_different_lr_is_named_and_left_out():
    runs = make_runs(seeds=(1, 2))
    best = tuned_table(runs)
    confirmation = pd.DataFrame([{"batch_size": b, "seed": s, "lr": best_lr_of(b) if b != 64 else 0.8,
                                  "steps_to_target": 100.0} for b in SIZES for s in (3, 4, 5)])
    combined, mismatches = add_confirmation_seeds(at_best_lr(runs, best), confirmation, best)
    assert len(combined) == len(SIZES) * 2 + (len(SIZES) - 1) * 3          # batch 64's three runs are out
    assert set(combined[combined.batch_size == 64]["seed"]) == {1, 2}
    assert (combined[combined.seed >= 3]["stage"] == "confirmation").all()
    assert (combined[combined.seed <= 2]["stage"] == "selection").all()
    assert mismatches.to_dict("records") == [{"batch_size": 64, "lr_run": 0.8, "lr_best": 0.2, "n_runs": 3}]
    alone, none = add_confirmation_seeds(at_best_lr(runs, best), None, best)
    assert len(alone) == len(SIZES) * 2 and none.empty


def test_lr_chosen_elsewhere_fits_every_fresh_seed_at_the_table_lr_with_the_tables_grid():
    selection = make_runs(seeds=(1, 2))
    chosen = tuned_table(selection)                               # as the exploratory report wrote it
    chosen.loc[chosen.batch_size == 1024, "interior"] = False     # the selection's grid decides "interior"
    fresh = make_runs(seeds=(20, 21, 22))
    fresh = fresh[fresh["lr"] == fresh["batch_size"].map(best_lr_of)]   # one lr per batch size, as the spec runs
    stray = fresh[fresh.batch_size == 64].assign(lr=0.8)           # a run at another lr than the table's
    tuned, per_seed, mismatches = lr_chosen_elsewhere(pd.concat([fresh, stray], ignore_index=True), chosen)
    assert len(per_seed) == len(SIZES) * 3 and (per_seed["stage"] == "confirmation").all()
    assert set(per_seed["seed"]) == {20, 21, 22}
    assert mismatches.to_dict("records") == [{"batch_size": 64, "lr_run": 0.8, "lr_best": 0.2, "n_runs": 3}]
    assert list(tuned["lr"]) == [best_lr_of(b) for b in SIZES]
    assert list(tuned["interior"]) == [b != 1024 for b in SIZES]   # the table's, not "a single lr is an edge"
    assert (tuned["n_lrs"] == 5).all() and (tuned["lr_min"] == 0.05).all() and (tuned["n_seeds"] == 3).all()
    for row in tuned.itertuples():   # oracle: the mean over the fresh seeds at the chosen lr
        steps = fresh[fresh.batch_size == row.batch_size]["steps_to_target"].to_numpy(float)
        assert row.steps_mean == pytest.approx(steps.mean())
    with pytest.raises(ConfigError, match="lacks the column"):
        lr_chosen_elsewhere(fresh, chosen[["batch_size", "lr"]])
    with pytest.raises(ConfigError, match="no run is at the lr"):
        lr_chosen_elsewhere(fresh.assign(lr=3.0), chosen)


def test_fit_points_leave_out_failed_runs_and_batch_sizes_with_fewer_than_3_reached():
    per_seed = pd.DataFrame({"batch_size": [8] * 5 + [64] * 5, "seed": list(range(1, 6)) * 2,
                             "steps_to_target": [10, 11, None, 12, 13, 5, None, None, None, 6]})
    points, counts = fit_points(per_seed)
    assert list(points["batch_size"]) == [8, 8, 8, 8]          # 64: 2 of 5 reached, out altogether
    assert counts.set_index("batch_size")[["n_seeds", "n_reached", "in_fit"]].to_dict("index") == {
        8: {"n_seeds": 5, "n_reached": 4, "in_fit": True}, 64: {"n_seeds": 5, "n_reached": 2, "in_fit": False}}
    assert len(fit_points(per_seed, min_reached=2)[0]) == 6


def fake_fit(b_crit: float, low: float, high: float):
    """A CriticalBatchFit with a given B_crit and interval (the verdict reads only these)."""
    from bsresearch.measure.critical import CriticalBatchFit
    nan = math.nan
    return CriticalBatchFit(s_min=nan, b_crit=b_crit, e_min=nan, s_min_std_error=nan, b_crit_std_error=nan,
                            e_min_std_error=nan, s_min_interval=(nan, nan), b_crit_interval=(low, high),
                            confidence=0.95, n_points=30, rms_log_residual=nan)


@pytest.mark.parametrize("b_crit, low, high, verdict", [
    (32, 25, 41, Verdict.REPRODUCED),          # [4 B_min, B_max/4] = [8, 1000]
    (32, 6, 41, Verdict.PARTLY),               # the interval crosses 4 B_min
    (900, 500, math.inf, Verdict.PARTLY),      # an end the data cannot bound
    (1200, 900, 1500, Verdict.NOT_REPRODUCED),
    (5, 3, 9, Verdict.NOT_REPRODUCED),
])
def test_critical_batch_verdicts_against_4_b_min_and_b_max_over_4(b_crit, low, high, verdict):
    sizes = [2, 4, 8, 16, 40, 80, 200, 400, 1000, 4000]
    test = critical_batch_test(fake_fit(b_crit, low, high), sizes, all_interior=True)
    assert (test.lower, test.upper) == (8, 1000) and test.n_batch_sizes == 10
    assert test.verdict == verdict and test.valid


def test_critical_batch_is_not_testable_with_an_edge_lr_or_fewer_than_6_batch_sizes():
    fit = fake_fit(32, 25, 41)
    edge = critical_batch_test(fit, [2, 4, 8, 16, 40, 80, 200, 4000], all_interior=False)
    assert edge.verdict == Verdict.NOT_TESTABLE and "edge" in edge.reason
    few = critical_batch_test(fit, [2, 8, 40, 200, 4000], all_interior=True)
    assert few.verdict == Verdict.NOT_TESTABLE and "5 batch sizes" in few.reason and not few.valid


@pytest.mark.parametrize("b_simple_scale, low, high, verdict", [
    (1.0, 20, 50, Verdict.REPRODUCED),            # b_simple = 100, B_crit 32: r = 3.1, interval [2, 5]
    (1.0, 5, 50, Verdict.PARTLY),                  # 100 / 5 = 20 > 10
    (50.0, 20, 50, Verdict.NOT_REPRODUCED),        # r = 156
])
def test_noise_ratio_is_the_ratio_of_means_over_b_crit(b_simple_scale, low, high, verdict):
    at_weights = pd.DataFrame({"trace_cov": [100.0, 300.0], "grad_sq_norm": [1.0, 3.0]}) \
        .assign(trace_cov=lambda d: d.trace_cov * b_simple_scale)
    # ratio of means: (100 + 300)/(1 + 3) = 100, not the mean of the ratios (also 100 here: see below)
    b_test = critical_batch_test(fake_fit(32, low, high), [2, 4, 8, 16, 40, 80, 200, 4000], True)
    test = noise_ratio_test(at_weights, b_test)
    assert test.b_simple == pytest.approx(100 * b_simple_scale)
    assert test.ratio == pytest.approx(100 * b_simple_scale / 32)
    assert (test.ratio_low, test.ratio_high) == pytest.approx((100 * b_simple_scale / high, 100 * b_simple_scale / low))
    assert test.verdict == verdict and test.n_runs == 2
    mixed = pd.DataFrame({"trace_cov": [100.0, 100.0], "grad_sq_norm": [1.0, 9.0]})
    assert noise_ratio_test(mixed, b_test).b_simple == pytest.approx(20.0)   # not (100 + 100/9) / 2


def test_noise_ratio_is_not_testable_when_b_crit_is_not():
    b_test = CriticalBatchTest(32, 25, 41, 8, 1000, 4, True, False, Verdict.NOT_TESTABLE, "4 batch sizes")
    test = noise_ratio_test(pd.DataFrame({"trace_cov": [64.0], "grad_sq_norm": [1.0]}), b_test)
    assert test.verdict == Verdict.NOT_TESTABLE and test.ratio == pytest.approx(2.0)


def test_largest_batch_fraction():
    runs = pd.DataFrame({"batch_size": [2, 400, 4000], "n_train": [4000] * 3})
    assert largest_batch_fraction(runs) == (1.0, 4000, 4000)


def make_history() -> pd.DataFrame:
    """Train loss of every run of make_runs(noise=0) as loss = 0.3 (S/step) at evaluations every 10 steps up to
    the step where it reached 0.3, so the first evaluation at or below target L is at ceil(0.3 S/(L 10)) x 10."""
    rows = []
    for i, run in make_runs(noise=0.0).iterrows():
        steps = run.steps_to_target
        last = 5000 if pd.isna(steps) else int(math.ceil(steps / 10) * 10)
        for step in range(10, last + 1, 10):
            loss = 9.0 if pd.isna(steps) else 0.3 * steps / step
            rows.append({"run_id": f"r{i}", "batch_size": run.batch_size, "config_lr": run.lr, "lr": run.lr,
                         "seed": run.seed, "step": step, "examples": step * run.batch_size,
                         "epoch": step / 100, "train_loss": loss})
    return pd.DataFrame(rows)


def test_steps_at_targets_take_the_first_evaluation_at_or_below_each_target():
    history = make_history()
    table = steps_at_targets(history, [0.6, 0.3])
    runs = make_runs(noise=0.0).reset_index(drop=True)
    for target in (0.6, 0.3):
        got = table[table.target == target].set_index("run_id")["steps_to_target"]
        for i, run in runs.iterrows():
            s = run.steps_to_target
            expected = math.nan if pd.isna(s) else math.ceil(0.3 * s / target / 10) * 10
            assert (math.isnan(expected) and math.isnan(got[f"r{i}"])) or got[f"r{i}"] == expected


def test_b_crit_by_target_fits_each_target():
    table = steps_at_targets(make_history(), [0.6, 0.3])
    out = b_crit_by_target(table, selection_seeds=(1, 2)).set_index("target")
    assert list(out.index) == [0.3, 0.6]
    # at 0.3 the steps are S_min (1 + B_crit/B) x the lr penalty (1 at the best lr), to a 10-step resolution
    assert out.loc[0.3, "b_crit"] == pytest.approx(B_CRIT, rel=0.02)
    assert out.loc[0.6, "b_crit"] == pytest.approx(B_CRIT, rel=0.05)   # half the steps, the same B_crit
    assert out.loc[0.6, "s_min"] == pytest.approx(S_MIN / 2, rel=0.05)
    assert (out["n_batch_sizes"] == len(SIZES)).all() and (out["n_points"] == len(SIZES) * 3).all()


def test_two_batch_summary_is_a_ratio_of_means_with_a_bootstrap_interval():
    pairs = pd.DataFrame({"grad_sq_norm": [1.0, 3.0, -1.0, 1.0], "trace_cov": [10.0, 50.0, 20.0, 0.0]})
    out = two_batch_summary(pairs, n_bootstrap=500)
    assert out["b_simple"] == pytest.approx(80.0 / 4.0)      # mean tr / mean |G|^2 = 20 / 1
    assert out["frac_pairs_negative"] == 0.25 and out["n_pairs"] == 4
    rng = np.random.default_rng(0)                          # oracle: the same resamples by hand
    idx = rng.integers(0, 4, size=(500, 4))
    g, t = pairs.grad_sq_norm.to_numpy()[idx].mean(1), pairs.trace_cov.to_numpy()[idx].mean(1)
    boot = np.where(g > 0, t / np.where(g > 0, g, 1), np.inf)
    ordered = np.sort(boot)    # the ends: the 13th and 488th of 500 sorted values (ceil(500 q))
    assert (out["low"], out["high"]) == (ordered[12], ordered[487])
    assert out["high"] == math.inf   # resamples of mostly the negative pair: no finite upper end


def test_two_batch_pairs_match_the_library_estimator_drawn_the_same_way():
    import torch  # a dependency of bsresearch: nothing to skip

    from bsresearch.noise.pairs import two_batch_noise_scale
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 5, generator=g), torch.randint(0, 3, (64,), generator=g)
    model = torch.nn.Linear(5, 3)
    pairs = two_batch_pairs(model, x, y, 4, 16, 6, torch.Generator().manual_seed(1))
    oracle = two_batch_noise_scale(model, x, y, 4, 16, n_draws=6, generator=torch.Generator().manual_seed(1))
    assert pairs["sq_norm_small"].mean() == pytest.approx(oracle.sq_norm_small, rel=1e-6)
    assert pairs["sq_norm_big"].mean() == pytest.approx(oracle.sq_norm_big, rel=1e-6)
    assert two_batch_summary(pairs)["b_simple"] == pytest.approx(oracle.b_simple, rel=1e-6)


# ----------------------------------------------------------------------------- regimes and exponents
def test_regime_boundaries_are_where_the_fitted_exponent_is_08_and_02():
    low, high = regime_boundaries(100.0)
    assert (low, high) == pytest.approx((25.0, 400.0))
    fit = fit_critical_batch([8, 64, 512], [400 * (1 + 100 / b) for b in (8, 64, 512)])
    for b, expected in ((low, 0.8), (high, 0.2)):  # oracle: numerical -dlogS/dlogB of the fitted curve
        h = 1e-5
        slope = (math.log(fit.predict_steps(b * math.exp(h))) - math.log(fit.predict_steps(b * math.exp(-h)))) / (2 * h)
        assert -slope == pytest.approx(expected, rel=1e-4)
    assert regime_of([10, 25, 100, 400, 4000], 100.0) == [REGIMES[0], REGIMES[0], REGIMES[1], REGIMES[2], REGIMES[2]]
    assert exponent_regime(0.95) == REGIMES[0] and exponent_regime(0.5) == REGIMES[1]
    assert exponent_regime(-0.1) == REGIMES[2] and exponent_regime(math.nan) == "unknown"
    with pytest.raises(ConfigError, match="0 < maximal < perfect < 1"):
        regime_boundaries(100.0, perfect=0.2, maximal=0.8)


def test_local_exponents_measure_the_slope_between_neighbours():
    sizes = np.array([4.0, 16.0, 64.0, 256.0])
    table = pd.DataFrame({"batch_size": sizes, "steps_mean": S_MIN * (1 + B_CRIT / sizes)})
    out = local_exponents(table, b_crit=B_CRIT)
    for _, row in out.iterrows():
        s1, s2 = S_MIN * (1 + B_CRIT / row.b_small), S_MIN * (1 + B_CRIT / row.b_large)
        assert row.exponent == pytest.approx(-math.log(s2 / s1) / math.log(row.b_large / row.b_small))
        mid = math.sqrt(row.b_small * row.b_large)
        assert row.fitted_exponent == pytest.approx(B_CRIT / (mid + B_CRIT))
    perfect = local_exponents(pd.DataFrame({"batch_size": sizes, "steps_mean": 1000 / sizes}))
    assert np.allclose(perfect["exponent"], 1.0) and (perfect["regime"] == REGIMES[0]).all()
    flat = local_exponents(pd.DataFrame({"batch_size": sizes, "steps_mean": [100.0] * 4}))
    assert np.allclose(flat["exponent"], 0.0) and (flat["regime"] == REGIMES[2]).all()


def test_fit_tuned_lr_recovers_eps_max_and_leaves_out_edges():
    sizes = np.array([2.0, 8.0, 32.0, 128.0, 512.0, 4000.0])
    table = pd.DataFrame({"batch_size": sizes, "lr": 0.6 / (1 + 30 / sizes), "interior": True})
    fit = fit_tuned_lr(table)
    assert fit.eps_max == pytest.approx(0.6, rel=1e-6) and fit.b_lr == pytest.approx(30, rel=1e-6)
    assert fit.predict(30.0) == pytest.approx(0.3)
    edged = table.assign(lr=np.where(sizes == 4000, 5.0, table["lr"]), interior=sizes != 4000)
    assert fit_tuned_lr(edged).eps_max == pytest.approx(0.6, rel=1e-6)  # the edge point is not used


# ----------------------------------------------------------------------------- the noise scale along training
def noise_runs() -> pd.DataFrame:
    rows = []
    for seed in (1, 2):
        for step, loss in ((1, 2.3), (100, 1.0), (400, 0.5), (1000, 0.25), (2000, 0.1)):
            rows.append({"state": "ok", "batch_size": 80, "lr": 0.5, "seed": seed, "steps": step,
                         "examples": 80 * step, "train_loss": loss, "test_acc": 0.5,
                         "noise_b_simple": 10 * seed / loss, "noise_b_noise": 30 / loss,
                         "noise_b_noise_std_error": 1.0, "noise_trace_cov": 1.0, "noise_grad_sq_norm": 1.0})
    rows.append({"state": "diverged", "batch_size": 80, "lr": 0.5, "seed": 3, "steps": 5, "train_loss": 9.0})
    return pd.DataFrame(rows).sample(frac=1.0, random_state=0)   # shuffled: the function sorts


def test_noise_checkpoints_is_tidy_and_sorted():
    table = noise_checkpoints(noise_runs())
    assert list(table["seed"]) == [1] * 5 + [2] * 5
    assert list(table["step"][:5]) == [1, 100, 400, 1000, 2000]
    assert {"b_simple", "b_noise", "b_noise_std_error", "train_loss"} <= set(table.columns)
    empty = noise_checkpoints(pd.DataFrame({"state": ["ok"], "steps": [3]}))
    assert empty.empty and "b_simple" in empty


def test_value_at_loss_interpolates_log_log_at_the_first_crossing():
    table = noise_checkpoints(noise_runs())
    out = value_at_loss(table, 0.3, "b_simple").set_index("seed")
    # b_simple = 10 seed / loss is a power law in the loss: log-log interpolation is exact
    assert out.loc[1, "b_simple"] == pytest.approx(10 / 0.3) and out.loc[2, "b_simple"] == pytest.approx(20 / 0.3)
    assert (out.loc[1, "step_before"], out.loc[1, "step_after"]) == (400, 1000)
    never = value_at_loss(table, 0.01, "b_simple")
    assert never["b_simple"].isna().all()
    already = value_at_loss(table, 5.0, "b_simple")   # below the target at the first checkpoint
    assert already["b_simple"].isna().all()


# ----------------------------------------------------------------------------- figures
def fitted():
    runs = make_runs()
    table = tuned_table(runs)
    per_seed = at_best_lr(runs, table)
    fit = fit_critical_batch(per_seed["batch_size"], per_seed["steps_to_target"])
    return runs, table, per_seed, fit


def test_steps_and_examples_plots_draw_the_fit_and_the_regimes():
    runs, table, per_seed, fit = fitted()
    fig, (ax1, ax2) = plt.subplots(1, 2)
    steps_vs_batch(ax1, per_seed, table, fit)
    curve = [line for line in ax1.get_lines() if len(line.get_xdata()) == 200][0]
    assert np.allclose(curve.get_ydata(), fit.predict_steps(curve.get_xdata()))
    assert ax1.get_xscale() == "log" and ax1.get_yscale() == "log"
    low, high = regime_boundaries(fit.b_crit)
    spans = [p for p in ax1.patches if p.get_zorder() == 0]
    assert len(spans) == 3  # three regimes inside the axis limits
    edges = sorted({round(v, 6) for p in spans for v in (p.get_x(), p.get_x() + p.get_width())})
    assert any(abs(e - low) < 1e-6 * low for e in edges) and any(abs(e - high) < 1e-6 * high for e in edges)
    examples_vs_batch(ax2, per_seed, table, fit)
    curve = [line for line in ax2.get_lines() if len(line.get_xdata()) == 200][0]
    assert np.allclose(curve.get_ydata(), fit.predict_examples(curve.get_xdata()))
    assert "0.8" in regime_legend_text() and "4 B_crit" in regime_legend_text()
    plt.close(fig)


@pytest.mark.parametrize("spread", ["std", "interval"])
def test_error_bars_are_the_seed_std_or_the_t_interval(spread):
    _, table, per_seed, fit = fitted()
    fig, ax = plt.subplots()
    steps_vs_batch(ax, per_seed, table, fit, spread=spread, regimes=False)
    from matplotlib.collections import LineCollection
    bars = [c for c in ax.collections if isinstance(c, LineCollection)][0]
    tops = np.array([seg[1][1] for seg in bars.get_segments()])
    expected = (table["steps_mean"] + table["steps_std"]) if spread == "std" else table["steps_high"]
    assert np.allclose(tops, expected)
    with pytest.raises(ValueError, match="spread"):
        steps_vs_batch(ax, per_seed, table, fit, spread="sem")
    plt.close(fig)


def test_mark_regimes_leaves_out_regimes_beyond_the_axis():
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.set_xlim(1000, 8000)          # all above 4 B_crit = 200
    mark_regimes(ax, 50.0)
    assert len([p for p in ax.patches]) == 1 and ax.get_xlim() == (1000, 8000)
    plt.close(fig)


def test_tuned_lr_and_steps_vs_lr_plots():
    runs, table, _, _ = fitted()
    table.loc[table.batch_size == 1024, "interior"] = False
    capped = runs.copy()
    capped.loc[(capped.batch_size == 1024) & (capped.lr == 0.05) & (capped.seed == 2), "steps_to_target"] = None
    fig, (ax1, ax2) = plt.subplots(1, 2)
    tuned_lr_vs_batch(ax1, table, runs, lr_fit=fit_tuned_lr(table))
    open_markers = [c for c in ax1.collections if len(c.get_offsets()) == 1]
    assert len(open_markers) == 1 and tuple(open_markers[0].get_offsets()[0]) == (1024, 0.4)
    steps_vs_lr(ax2, capped)
    marks = {c.get_label(): c for c in ax2.collections if len(c.get_offsets())}
    # batch 4 diverged at 0.8 (x), batch 1024 at 0.05 has a capped seed (triangle): both in the top strip, in
    # axes fractions, not at a number of steps
    diverged, cap = marks["a seed diverged (top strip)"], marks["a seed hit its step cap (top strip)"]
    assert tuple(diverged.get_offsets()[0]) == (0.8, 0.96) and tuple(cap.get_offsets()[0]) == (0.05, 0.91)
    assert diverged.get_offset_transform() == ax2.get_xaxis_transform()
    strip = [patch for patch in ax2.patches if patch.get_height() == 0.12]         # in axes fractions
    assert len(strip) == 1 and strip[0].get_y() == 0.88               # the grey strip along the top edge
    assert ax2.get_ylim()[0] > 1                                       # not stretched down to the strip
    assert len(ax2.get_lines()) == len(SIZES)
    colours = [tuple(line.get_color()) for line in ax2.get_lines()]
    assert len(set(colours)) == len(SIZES)                 # one colour per batch size, from the colour bar
    assert any(a.get_ylabel() == "batch size (examples per update)" for a in fig.axes)
    plt.close(fig)


def test_noise_vs_training_draws_each_seed_marks_b_crit_and_keeps_non_positive_values():
    _, _, _, fit = fitted()
    table = noise_checkpoints(noise_runs())
    table.loc[(table.seed == 2) & (table.step == 1), "b_noise"] = -50.0   # negative curvature
    fig, (ax1, ax2) = plt.subplots(1, 2)
    noise_vs_training(ax1, table, fit, x="step")
    lines = {line.get_label(): line for line in ax1.get_lines()}
    seed1 = table[table.seed == 1]
    assert np.allclose(lines["B_simple, seed 1"].get_xdata(), seed1["step"])
    assert np.allclose(lines["B_simple, seed 1"].get_ydata(), seed1["b_simple"])
    assert len(lines["B_noise, seed 2"].get_xdata()) == 4 and min(lines["B_noise, seed 2"].get_ydata()) > 0
    edge = [c for c in ax1.collections if c.get_label() == "B_noise <= 0, seed 2 (bottom edge)"]
    assert len(edge) == 1 and tuple(edge[0].get_offsets()[0]) == (1, 0.02)   # at its step, on the bottom edge
    assert lines["B_simple, seed 2"].get_linestyle() != lines["B_simple, seed 1"].get_linestyle()
    assert any(np.allclose(line.get_ydata(), fit.b_crit) for line in ax1.get_lines())
    noise_vs_training(ax2, table, fit, x="train_loss", target_loss=0.3)
    assert not ax2.xaxis_inverted() and ax2.get_xscale() == "log"
    assert any(np.allclose(line.get_xdata(), 0.3) for line in ax2.get_lines())
    plt.close(fig)


def test_noise_at_target_vs_batch_draws_the_geometric_mean():
    _, _, _, fit = fitted()
    table = pd.DataFrame({"batch_size": [8, 8, 64, 64], "b_simple": [10.0, 1000.0, 50.0, 200.0]})
    fig, ax = plt.subplots()
    noise_at_target_vs_batch(ax, table, fit)
    line = [line for line in ax.get_lines() if line.get_label() == "geometric mean over seeds"][0]
    assert np.allclose(line.get_ydata(), [100.0, 100.0]) and list(np.asarray(line.get_xdata())) == [8, 64]
    assert ax.get_yscale() == "log"
    plt.close(fig)




def test_fit_tuned_lr_needs_two_interior_points():
    table = pd.DataFrame({"batch_size": [8.0, 64.0], "lr": [0.1, 0.4], "interior": [True, False]})
    with pytest.raises(ConfigError, match="2 or more batch sizes"):
        fit_tuned_lr(table)


def test_b_crit_vs_target_and_two_batch_vs_exact_draw_their_tables():
    table = pd.DataFrame({"target": [0.5, 0.3, 0.4], "b_crit": [20.0, 40.0, 30.0], "b_crit_low": [10.0, 30.0, 20.0],
                          "b_crit_high": [30.0, math.inf, 45.0], "n_batch_sizes": [8, 10, 9]})
    fig, (ax1, ax2) = plt.subplots(1, 2)
    b_crit_vs_target(ax1, table)
    line = ax1.get_lines()[0]
    assert list(np.asarray(line.get_xdata())) == [0.3, 0.4, 0.5] and list(np.asarray(line.get_ydata())) == [40, 30, 20]
    arrows = [c for c in ax1.collections if c.get_label() == "upper end unbounded"]
    assert len(arrows) == 1 and tuple(arrows[0].get_offsets()[0]) == (0.3, 0.97)
    assert not ax1.xaxis_inverted()
    checkpoints = pd.DataFrame({"seed": [1, 1, 2, 2], "step": [10, 100, 10, 100], "exact": [5.0, 50.0, 6.0, 60.0],
                                "two_batch": [4.0, 55.0, 7.0, 58.0], "two_batch_low": [3.0, 40.0, 5.0, -1.0],
                                "two_batch_high": [5.0, 70.0, 9.0, math.inf]})
    two_batch_vs_exact(ax2, checkpoints)
    exact = [line for line in ax2.get_lines() if line.get_label().startswith("exact")]
    assert len(exact) == 2 and list(np.asarray(exact[1].get_ydata())) == [6.0, 60.0]
    plt.close(fig)


# ----------------------------------------------------------------------------- the noise scale under every summary (v4)
NOISE_SIZES = [2, 4, 8, 16, 40, 80, 200, 400, 1000, 4000]
FRESH = [30, 31, 32, 33, 34]


def _fit_points() -> pd.DataFrame:
    """S = 600 (1 + 40/B) x exp(0.05 (seed - 32)): every seed has every batch size, so B_crit = 40 exactly in the fit
    and in every resample of the seeds (a seed's factor only moves S_min)."""
    return pd.DataFrame([{"batch_size": b, "seed": s, "steps_to_target": 600 * (1 + 40 / b) * math.exp(0.05 * (s - 32))}
                         for b in NOISE_SIZES for s in FRESH])


def _at_weights(b_simple=lambda b, s: 200.0) -> pd.DataFrame:
    """One row per run: |G|^2 varying over runs, tr(Sigma) = b_simple(b, s) x |G|^2."""
    rows = []
    for b in NOISE_SIZES:
        for s in FRESH:
            grad = 0.1 + 0.01 * (s - 30) + 1 / b
            rows.append({"batch_size": b, "seed": s, "grad_sq_norm": grad, "trace_cov": b_simple(b, s) * grad})
    return pd.DataFrame(rows)


def test_b_simple_summaries_by_hand():
    from bsresearch.findings.steps_to_target import b_simple_summaries
    values = b_simple_summaries(pd.DataFrame({"trace_cov": [100.0, 100.0, 100.0], "grad_sq_norm": [1.0, 2.0, 0.1]}))
    assert values["ratio_of_means"] == pytest.approx(300 / 3.1)            # per run: 100, 50, 1000
    assert values["mean"] == pytest.approx(1150 / 3) and values["median"] == pytest.approx(100.0)
    assert values["geometric_mean"] == pytest.approx((100 * 50 * 1000) ** (1 / 3))
    negative = b_simple_summaries(pd.DataFrame({"trace_cov": [1.0, 1.0], "grad_sq_norm": [1.0, -1.0]}))
    assert negative["mean"] == math.inf and negative["ratio_of_means"] == math.inf


def test_noise_ratio_summaries_refit_b_crit_in_every_seed_resample():
    from bsresearch.findings.steps_to_target import noise_ratio_summaries, noise_summary_test
    table = noise_ratio_summaries(_at_weights(), _fit_points(), n_boot=200).set_index("summary")
    assert list(table.index) == ["ratio_of_means", "mean", "median", "geometric_mean"]
    assert table["b_crit"].to_numpy() == pytest.approx([40.0] * 4, rel=1e-6)
    assert table["ratio"].to_numpy() == pytest.approx([5.0] * 4, rel=1e-6)
    # B_simple is 200 in every run and B_crit 40 in every resample: the bootstrap interval is [5, 5]
    assert table["ratio_low"].to_numpy() == pytest.approx([5.0] * 4, rel=1e-5)
    assert table["ratio_high"].to_numpy() == pytest.approx([5.0] * 4, rel=1e-5)
    fit = critical_batch_fits(_fit_points()).set_index("fit").loc["all seeds"]
    assert table.loc["mean", "fit_low"] == pytest.approx(200 / fit["b_crit_high"])
    assert table.loc["mean", "fit_high"] == pytest.approx(200 / fit["b_crit_low"])
    assert (table["n_runs"] == 50).all() and (table["n_seeds"] == 5).all() and (table["n_boot_failed"] == 0).all()
    assert noise_summary_test(table.reset_index()).verdict == Verdict.REPRODUCED


def test_noise_summary_test_partly_when_a_heavy_tail_moves_the_mean_of_the_ratios():
    from bsresearch.findings.steps_to_target import noise_ratio_summaries, noise_summary_test
    # the batch-2 run of every seed has B_simple 20 000 (its |G|^2 is small): the mean of the per-run ratios is
    # (49 x 200 + ... ) / 50 ~ 596, r ~ 14.9; the ratio of means stays near 200 because |G|^2 is small there
    tail = _at_weights(lambda b, s: 20000.0 if b == 2 else 200.0)
    tail.loc[tail.batch_size == 2, "grad_sq_norm"] = 0.001
    tail.loc[tail.batch_size == 2, "trace_cov"] = 20.0
    table = noise_ratio_summaries(tail, _fit_points(), n_boot=200)
    test = noise_summary_test(table)
    by = test.table.set_index("summary")
    assert by.loc["mean", "b_simple"] == pytest.approx((45 * 200 + 5 * 20000) / 50)
    assert by.loc["ratio_of_means", "inside"] and not by.loc["mean", "inside"] and by.loc["median", "inside"]
    assert test.verdict == Verdict.PARTLY and "mean" in test.reason


def test_noise_summary_test_not_reproduced_and_not_testable():
    from bsresearch.findings.steps_to_target import noise_ratio_summaries, noise_summary_test
    big = noise_ratio_summaries(_at_weights(lambda b, s: 800.0), _fit_points(), n_boot=50)   # r = 20
    assert noise_summary_test(big).verdict == Verdict.NOT_REPRODUCED
    invalid = CriticalBatchTest(40, 35, 46, 8, 1000, 4, False, False, Verdict.NOT_TESTABLE, "a best lr on the edge")
    ok = noise_ratio_summaries(_at_weights(), _fit_points(), n_boot=50)
    assert noise_summary_test(ok, invalid).verdict == Verdict.NOT_TESTABLE
    with pytest.raises(ConfigError, match="no column 'trace_cov'"):
        noise_ratio_summaries(_at_weights().drop(columns="trace_cov"), _fit_points())


def test_two_batch_agreement_counts_points_within_a_factor_and_averages_logs_per_seed():
    from bsresearch.findings.steps_to_target import near_loss, two_batch_agreement
    table = pd.DataFrame({"seed": [1, 1, 1, 2, 2, 2], "train_loss": [0.56, 0.33, 0.23, 0.43, 0.30, 0.12],
                          "exact": [100.0] * 6, "two_batch": [115.0, 83.0, 157.0, 89.5, math.inf, 96.3]})
    agreement = two_batch_agreement(table)
    assert agreement.n == 6 and agreement.n_within == 4 and agreement.n_nonfinite == 1   # 1.57 and inf are out
    assert agreement.share_within == pytest.approx(4 / 6) and not agreement.agrees
    logs = np.array([np.mean(np.log([1.15, 0.83, 1.57])), np.mean(np.log([0.895, 0.963]))])   # inf left out
    half = stats.t.ppf(0.975, 1) * logs.std(ddof=1) / math.sqrt(2)
    assert agreement.geo_ratio == pytest.approx(math.exp(logs.mean())) and agreement.n_seeds == 2
    assert (agreement.geo_low, agreement.geo_high) == pytest.approx((math.exp(logs.mean() - half),
                                                                     math.exp(logs.mean() + half)))
    assert list(agreement.table["within"]) == [True, True, False, True, False, True]
    close = two_batch_agreement(table.assign(two_batch=[101.0, 99.0, 102.0, 98.0, 100.0, 101.0]))
    assert close.agrees and close.share_within == 1.0
    assert list(near_loss(table, 0.3)["train_loss"]) == [0.56, 0.33, 0.23, 0.43, 0.30]   # 0.15 <= loss <= 0.6
