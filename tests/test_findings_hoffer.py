"""Hoffer et al.: the log(t) distance fit, the ingredients of the recipe and their figures, on made-up tables."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from conftest import variant_rows

from bsresearch import stats
from bsresearch.config import ConfigError
from bsresearch.findings import hoffer
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings import hoffer as hoffer_plots
from bsresearch.plots.findings.hoffer import distance_panel, variant_points


def _history(variant, seed, slope, decay_at=100, last=400, warmup=0):
    """A run whose distance grows as slope * ln t at the peak lr, then stays put after the lr decays."""
    rows = []
    for t in [0, 1, 2, 5, 10, 20, 50, 100, 200, 400]:
        if t > last:
            continue
        lr = 0.1 * (t / warmup if 0 < t < warmup else 1.0) * (0.1 if t > decay_at else 1.0)
        d = slope * math.log(min(max(t, 1), decay_at))
        rows.append({"variant": variant, "seed": seed, "run_id": f"{variant}{seed}", "step": t, "lr": lr,
                     "distance_from_init": d})
    return rows


def test_log_fit_recovers_a_logarithm_and_prefers_it_to_a_power_law():
    t = np.array([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000.0])
    fit = hoffer.fit_log_time(t, 2.0 + 3.0 * np.log(t))
    assert fit.slope == pytest.approx(3.0) and fit.intercept == pytest.approx(2.0)
    assert fit.r2 == pytest.approx(1.0) and fit.r2_power < 0.99
    assert fit.n_points == 10 and (fit.t_min, fit.t_max) == (1.0, 1000.0)
    assert fit.predict(np.array([math.e])) == pytest.approx([5.0])


def test_power_fit_recovers_a_random_walk_and_the_log_model_fits_it_worse():
    t = np.geomspace(1, 1e4, 30)
    fit = hoffer.fit_log_time(t, 0.5 * np.sqrt(t))
    assert fit.alpha == pytest.approx(0.5) and fit.scale == pytest.approx(0.5)
    assert fit.r2_power == pytest.approx(1.0) and fit.r2 < 0.9
    assert fit.predict_power(np.array([100.0])) == pytest.approx([5.0])


def test_log_fit_uses_only_the_range_and_positive_distances():
    t = np.array([0, 1, 10, 100, 1000, 10_000, 100_000, 1e6])
    d = np.array([0.0, -1.0, 1.0, 2.0, 3.0, 4.0, 50.0, 99.0])   # d = log10 t on [10, 10^4]; junk outside
    fit = hoffer.fit_log_time(t, d, t_min=10, t_max=10_000)
    assert fit.n_points == 4 and fit.decades == pytest.approx(3.0)
    assert fit.slope == pytest.approx(1 / math.log(10)) and fit.r2 == pytest.approx(1.0)
    few = hoffer.fit_log_time([10, 100, 1000], [1.0, 2.0, 3.0])
    assert few.n_points == 3 and math.isnan(few.slope) and math.isnan(few.r2) and math.isnan(few.delta_aic)


def test_constant_lr_end_is_the_last_step_at_the_peak_lr():
    hist = pd.DataFrame(_history("a", 0, 1.0, decay_at=100, warmup=5))
    assert hoffer.constant_lr_end(hist) == 100
    flat = pd.DataFrame(_history("a", 0, 1.0, decay_at=10_000))
    assert hoffer.constant_lr_end(flat) == 400


def test_distance_fits_one_row_per_run_in_the_first_lr_phase():
    hist = pd.DataFrame(_history("sb", 0, 2.0) + _history("sb", 1, 2.0) + _history("lb", 0, 0.5))
    fits = hoffer.distance_fits(hist, t_min=2)
    assert list(fits[["variant", "seed"]].itertuples(index=False, name=None)) == [("sb", 0), ("sb", 1), ("lb", 0)]
    assert fits["slope"].tolist() == pytest.approx([2.0, 2.0, 0.5])
    assert (fits["t_max"] == 100).all() and fits["r2"].tolist() == pytest.approx([1.0] * 3)
    whole = hoffer.distance_fits(hist, t_min=2, first_phase=False)   # the plateau after the decay bends it
    assert (whole["t_max"] == 400).all() and (whole["r2"] < 0.99).all()


def test_ingredient_pairs_and_effects_on_a_factorial_design():
    names = ["sb", "lb", "lb_sqrt", "lb_ra", "lb_sqrt_ra", "lb_gbn_ra"]
    assert hoffer.ingredient_pairs(names) == [("sqrt", "lb_sqrt", "lb"), ("ra", "lb_ra", "lb"),
                                               ("sqrt", "lb_sqrt_ra", "lb_ra"), ("ra", "lb_sqrt_ra", "lb_sqrt"),
                                               ("gbn", "lb_gbn_ra", "lb_ra")]   # no lb_gbn: no pair for its ra
    # accuracy = 0.5 + 0.1 sqrt + 0.3 ra (+ seed noise): every pair recovers its ingredient's effect
    effect = {"sqrt": 0.1, "ra": 0.3, "gbn": 0.0}
    rows = []
    for name in names[1:]:
        for seed in range(3):
            acc = 0.5 + sum(effect[i] for i in name.split("_")[1:]) + (seed - 1) / 100
            rows.append({"variant": name, "seed": seed, "state": "ok", "test_acc": acc})
    rows.append({"variant": "lb", "seed": 3, "state": "diverged", "test_acc": 0.0})   # not counted
    table = hoffer.ingredient_effects(pd.DataFrame(rows), "test_acc", names)
    assert list(table["ingredient"]) == ["sqrt", "sqrt", "ra", "ra", "gbn"]
    for _, row in table.iterrows():
        assert row["diff"] == pytest.approx(effect[row["ingredient"]])
        assert row["low"] < row["diff"] < row["high"] and row["n"] == row["n_reference"] == 3


def test_variant_points_lists_variants_top_down_with_intervals():
    rows = variant_rows()
    rows = rows[rows["batch_size"] == 8]
    table = stats.summarize_states(rows, "variant", ["test_acc"])
    fig, ax = plt.subplots()
    variant_points(ax, rows, table, "test_acc", order=["b", "a", "c"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a", "c"]   # unknown codes stay as they are
    assert list(ax.get_yticks()) == [2, 1, 0]
    means = ax.get_lines()[0]
    assert list(np.asarray(means.get_ydata())) == [2, 1, 0] and means.get_xdata() == pytest.approx([0.9] * 3)
    plt.close(fig)


def test_distance_panel_draws_the_fits_of_the_mean_curve_it_labels():
    hist = pd.DataFrame(_history("sb", 0, 2.0) + _history("sb", 1, 4.0))
    fig, ax = plt.subplots()
    fit = distance_panel(ax, hist, t_min=2, color="C3")
    assert ax.get_xscale() == "log"
    assert fit.slope == pytest.approx(3.0) and (fit.t_min, fit.t_max) == (2, 100)   # the mean curve, first phase
    lines = ax.get_lines()
    thin, mean = lines[:2], lines[2]
    x_dashed = lambda line: np.asarray(line.get_xdata(), dtype=float)   # noqa: E731
    assert [line.get_linewidth() for line in thin] == [0.6, 0.6] and mean.get_linewidth() == 2
    assert np.asarray(mean.get_ydata())[-1] == pytest.approx(3.0 * math.log(100))
    dashed = next(line for line in lines if line.get_linestyle() == "--")
    dotted = next(line for line in lines if line.get_linestyle() == ":")
    assert x_dashed(dashed)[[0, -1]] == pytest.approx([2, 100])        # drawn over the fitted range only
    assert np.asarray(dashed.get_ydata()) == pytest.approx(fit.predict(x_dashed(dashed)))
    assert np.asarray(dotted.get_ydata()) == pytest.approx(fit.predict_power(x_dashed(dotted)))
    assert dashed.get_label() == f"a + b ln t, R$^2$ {fit.r2:.3f}" and "R$^2$ 1.000" in str(dashed.get_label())
    assert "not compared" in ax.texts[0].get_text()                      # 2 to 100: 1.7 decades < 2
    plt.close(fig)


def test_variant_label_spells_out_the_codes():
    assert hoffer_plots.variant_label("lb_sqrt_gbn_ra") == "LB + sqrt lr + ghost BN + regime adaptation"
    assert hoffer_plots.variant_label("sb") == "SB" and hoffer_plots.variant_label("lb_xyz") == "LB + xyz"


# ----------------------------------------------------------------------------- AIC: log t against a power law
def test_gaussian_aic_by_hand():
    assert hoffer.gaussian_aic(np.array([1.0, -1.0, 1.0, -1.0]), 2) == pytest.approx(6.0)   # 4 ln(4/4) + 2*3
    assert hoffer.gaussian_aic(np.array([2.0, 0.0]), 1) == pytest.approx(2 * math.log(2.0) + 4)


def test_aic_prefers_the_model_that_generated_the_data_on_the_same_points():
    rng = np.random.default_rng(0)
    t = np.geomspace(5, 800, 40)
    noise = rng.normal(0, 0.05, len(t))
    log_fit = hoffer.fit_log_time(t, 1.0 + 2.0 * np.log(t) + noise)
    power_fit = hoffer.fit_log_time(t, 0.5 * t ** 0.5 + noise)
    assert log_fit.delta_aic > 10 and power_fit.delta_aic < -10
    assert power_fit.alpha == pytest.approx(0.5, abs=0.01) and log_fit.slope == pytest.approx(2.0, abs=0.02)
    assert log_fit.decades == pytest.approx(math.log10(160))
    # the AICs are those of the residuals on d of the two least-squares fits (same points, same error model)
    d = 1.0 + 2.0 * np.log(t) + noise
    assert log_fit.aic_log == pytest.approx(hoffer.gaussian_aic(d - log_fit.predict(t), 2))
    assert log_fit.aic_power == pytest.approx(hoffer.gaussian_aic(d - log_fit.predict_power(t), 2))
    # least squares on d: no (scale, alpha) nearby does better than the fitted power law
    best = float(np.sum((d - log_fit.predict_power(t)) ** 2))
    for ds, da in [(1.01, 0), (0.99, 0), (1, 0.002), (1, -0.002)]:
        assert np.sum((d - log_fit.scale * ds * t ** (log_fit.alpha + da)) ** 2) > best


def test_aic_table_sums_runs_and_marks_short_ranges():
    fits = pd.DataFrame({"variant": ["sb", "sb", "sb", "lb", "lb"], "t_min": [5, 5, 5, 5, 5],
                         "t_max": [700, 700, 700, 22, 22], "decades": [2.146, 2.146, 2.146, 0.64, 0.64],
                         "aic_log": [-10.0, -20.0, -30.0, 1.0, 2.0], "aic_power": [-4.0, -22.0, -27.0, 0.0, 5.0],
                         "r2": [0.9] * 5, "r2_power": [0.8] * 5, "alpha": [0.5] * 5})
    fits["delta_aic"] = fits["aic_power"] - fits["aic_log"]           # 6, -2, 3 | -1, 3
    table = hoffer.aic_table(fits, order=["sb", "lb"]).set_index("variant")
    sb = table.loc["sb"]
    assert (sb["aic_log"], sb["aic_power"], sb["delta_aic"]) == (-60.0, -53.0, 7.0)
    assert sb["n_log_better"] == 2 and sb["n_runs"] == 3 and bool(sb["tested"])
    half = 4.302653 * np.std([6, -2, 3], ddof=1) / math.sqrt(3)                   # t(0.975, 2) = 4.3027
    assert sb["delta_aic_mean"] == pytest.approx(7 / 3)
    assert (sb["delta_aic_low"], sb["delta_aic_high"]) == pytest.approx((7 / 3 - half, 7 / 3 + half), rel=1e-5)
    assert not bool(table.loc["lb", "tested"]) and table.loc["lb", "delta_aic"] == 2.0


# ----------------------------------------------------------------------------- the pre-registered test
def _runs(values: dict[str, list[float]], states: dict[str, list[str]] | None = None) -> pd.DataFrame:
    rows = []
    for variant, accs in values.items():
        for seed, acc in enumerate(accs):
            state = (states or {}).get(variant, ["ok"] * len(accs))[seed]
            rows.append({"variant": variant, "seed": seed, "state": state, "test_acc": acc})
    return pd.DataFrame(rows)


SPREAD = np.array([-0.02, -0.01, 0.0, 0.01, 0.02])


def test_recipe_test_partly_when_the_recipe_closes_part_of_the_gap():
    # equal variances 2.5e-4, n = 5: se 0.01, Welch dof 8, t(0.975, 8) = 2.306004
    test = hoffer.recipe_test(_runs({"sb": list(0.92 + SPREAD), "lb": list(0.85 + SPREAD),
                                     "lb_sqrt_gbn_ra": list(0.915 + SPREAD)}))
    assert test.diff == pytest.approx(-0.005)
    assert (test.low, test.high) == pytest.approx((-0.005 - 0.02306004, -0.005 + 0.02306004), rel=1e-6)
    assert test.gap == pytest.approx(-0.07) and test.gap_high == pytest.approx(-0.07 + 0.02306004, rel=1e-6)
    assert test.closed_low == pytest.approx(0.065 - 0.02306004, rel=1e-6)
    assert test.verdict == Verdict.PARTLY and test.extend_seeds          # Delta's interval contains -1 point
    assert (test.n_recipe, test.n_sb, test.n_lb, test.n_unfinished) == (5, 5, 5, 0)


def test_recipe_test_reproduced_matches_scipy_welch():
    from scipy import stats as sps
    sb, recipe = 0.92 + SPREAD / 5, 0.925 + SPREAD / 4
    test = hoffer.recipe_test(_runs({"sb": list(sb), "lb": list(0.85 + SPREAD), "lb_sqrt_gbn_ra": list(recipe)}))
    oracle = sps.ttest_ind(recipe, sb, equal_var=False).confidence_interval(0.95)
    assert (test.low, test.high) == pytest.approx((oracle.low, oracle.high))
    assert test.low > -0.01 and test.verdict == Verdict.REPRODUCED and not test.extend_seeds


def test_recipe_test_not_reproduced_not_testable_and_divergence():
    gap = {"sb": list(0.92 + SPREAD), "lb": list(0.85 + SPREAD)}
    assert hoffer.recipe_test(_runs({**gap, "lb_sqrt_gbn_ra": list(0.85 + SPREAD)})).verdict == Verdict.NOT_REPRODUCED
    no_gap = hoffer.recipe_test(_runs({"sb": list(0.92 + SPREAD), "lb": list(0.92 + SPREAD),
                                       "lb_sqrt_gbn_ra": list(0.92 + SPREAD)}))
    assert no_gap.verdict == Verdict.NOT_TESTABLE and "no gap" in no_gap.why
    failed = _runs({**gap, "lb_sqrt_gbn_ra": list(0.925 + SPREAD / 5)},
                   {"sb": ["ok", "ok", "ok", "ok", "failed"]})
    assert hoffer.recipe_test(failed).verdict == Verdict.NOT_TESTABLE and hoffer.recipe_test(failed).n_unfinished == 1
    diverged = _runs({**gap, "sb": list(0.92 + SPREAD / 5), "lb_sqrt_gbn_ra": [0.1, *list(0.925 + SPREAD[1:] / 5)]},
                     {"lb_sqrt_gbn_ra": ["diverged", "ok", "ok", "ok", "ok"]})
    test = hoffer.recipe_test(diverged)                              # would be reproduced on the 4 that finished
    assert test.low > -0.01 and test.n_recipe_diverged == 1 and test.verdict == Verdict.PARTLY
    with pytest.raises(ConfigError, match="no column 'test_acc'"):
        hoffer.recipe_test(diverged.drop(columns="test_acc"))


# ----------------------------------------------------------------------------- the mechanism test (protocol v4)
LADDER_LOSS = {"sb": 0.03, "sb_x2": 0.01, "sb_x4": 0.003, "sb_x8": 0.001, "sb_x16": 0.0003}


def _mechanism_runs(acc: dict[str, float], recipe_loss: float = 0.0011, states: dict[str, list[str]] | None = None,
                    spread: np.ndarray = SPREAD / 5) -> pd.DataFrame:
    """Five seeds per variant: the ladder's train losses LADDER_LOSS (times 0.9, 1, 1.1, 1, 1 over the seeds,
    so each geometric mean is the value x 0.9^(1/5) x 1.1^(1/5)), the recipe's `recipe_loss`, and test accuracies
    acc[variant] + spread."""
    rows = []
    losses = {**LADDER_LOSS, "lb_sqrt_gbn_ra": recipe_loss, "lb": 0.2}
    for variant, base in acc.items():
        for seed, (factor, d) in enumerate(zip([0.9, 1.0, 1.1, 1.0, 1.0], spread)):
            state = (states or {}).get(variant, ["ok"] * 5)[seed]
            rows.append({"variant": variant, "seed": seed, "state": state, "test_acc": base + d,
                         "train_loss": losses[variant] * factor})
    return pd.DataFrame(rows)


ACC = {"sb": 0.90, "sb_x2": 0.91, "sb_x4": 0.92, "sb_x8": 0.93, "sb_x16": 0.93, "lb": 0.80}


def test_matched_control_picks_the_rung_nearest_in_log_train_loss():
    match = hoffer.matched_control(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.93}))
    scale = (0.9 * 1.1) ** 0.2                                   # the seeds' factors, as a geometric mean
    assert match.control == "sb_x8" and match.reached
    assert match.reference_loss == pytest.approx(0.0011 * scale)
    assert match.control_loss == pytest.approx(0.001 * scale)
    assert match.log2_distance == pytest.approx(math.log2(0.001 / 0.0011))
    assert list(match.table["variant"]) == list(hoffer.LADDER) and list(match.table["n_ok"]) == [5] * 5
    # nearer to 0.003 than to 0.001 on a log scale: sqrt(0.003 * 0.001) = 0.00173 is the midpoint
    nearer = hoffer.matched_control(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.9}, recipe_loss=0.0018))
    assert nearer.control == "sb_x4"
    # the recipe fits better than every rung: the nearest is the last, and it is not reached
    below = hoffer.matched_control(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.9}, recipe_loss=1e-5))
    assert below.control == "sb_x16" and not below.reached
    # a failed run does not count towards a rung's loss; a rung without ok runs is never chosen
    failed = _mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.9}, states={"sb_x8": ["failed"] * 5})
    assert hoffer.matched_control(failed).control == "sb_x4"           # |log2 0.003/0.0011| < |log2 0.0003/0.0011|
    assert math.isnan(hoffer.matched_control(failed).table.set_index("variant").loc["sb_x8", "loss"])


def test_matched_loss_test_reproduced_against_the_matched_small_batch_with_scipy_welch():
    from scipy import stats as sps
    runs = _mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.931})
    test = hoffer.matched_loss_test(runs)
    recipe = runs[runs.variant == "lb_sqrt_gbn_ra"].test_acc
    oracle = sps.ttest_ind(recipe, runs[runs.variant == "sb_x8"].test_acc, equal_var=False).confidence_interval(0.95)
    assert test.control == "sb_x8" and test.diff == pytest.approx(0.001)
    assert (test.low, test.high) == pytest.approx((oracle.low, oracle.high))
    assert test.short_diff == pytest.approx(0.031) and test.verdict == Verdict.REPRODUCED and not test.extend_seeds
    assert (test.n_recipe, test.n_control, test.n_short, test.n_unfinished) == (5, 5, 5, 0)


def test_matched_loss_test_partly_when_only_the_shorter_small_batch_is_matched():
    # equal spreads SPREAD / 5, n = 5: se 0.002, Welch dof 8, half-width 2.306004 x 0.002
    half = 2.306004 * 0.002
    test = hoffer.matched_loss_test(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.905}))
    assert test.diff == pytest.approx(-0.025) and test.low == pytest.approx(-0.025 - half, rel=1e-6)
    assert test.short_diff == pytest.approx(0.005) and test.short_low == pytest.approx(0.005 - half, rel=1e-6)
    assert test.verdict == Verdict.PARTLY and not test.extend_seeds


def test_rung_multiple_reads_the_epochs_multiple_from_the_rung_name():
    assert [hoffer.rung_multiple(r) for r in (*hoffer.LADDER, "sb_x32")] == [1, 2, 4, 8, 16, 32]
    assert hoffer.rung_multiple("lb_x_ra") == 1                          # "_x" not followed by a number


def test_ladder_plot_draws_the_rungs_means_ringed_sb_star_and_the_recipe():
    import matplotlib.pyplot as plt
    runs = _mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.931})
    test = hoffer.matched_loss_test(runs)
    fig, ax = plt.subplots()
    hoffer_plots.ladder_plot(ax, runs, test)
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    ladder = lines["small batch, 1-16x its epochs (mean)"]
    scale = (0.9 * 1.1) ** 0.2
    assert list(ladder.get_xdata()) == pytest.approx([v * scale for v in LADDER_LOSS.values()])
    assert list(ladder.get_ydata()) == pytest.approx([ACC[v] for v in hoffer.LADDER])
    ring = lines["SB* = sb_x8 (nearest train loss)"]
    assert ring.get_xdata()[0] == pytest.approx(0.001 * scale)
    star = lines[hoffer_plots.variant_label("lb_sqrt_gbn_ra")]
    assert star.get_marker() == "*" and star.get_ydata()[0] == pytest.approx(0.931)
    assert ax.get_xscale() == "log"
    # the axis spans the ladder's and the recipe's runs (a one-point difference stays visible); plain LB, far
    # below, is named off the axis
    low, high = ax.get_ylim()
    shown = runs[runs.variant.isin([*hoffer.LADDER, "lb_sqrt_gbn_ra"])].test_acc
    assert low <= shown.min() and shown.max() <= high and high - low < 2 * (shown.max() - shown.min()) + 0.01
    texts = [t.get_text() for t in ax.texts]
    lb = runs[runs.variant == "lb"].test_acc.mean()
    assert lb < low and texts == [f"off the axis: {hoffer_plots.variant_label('lb')}: mean {lb:.3g}"]
    plt.close(fig)


def test_matched_loss_test_not_reproduced_not_testable_divergence_and_seeds():
    assert hoffer.matched_loss_test(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.85})).verdict == Verdict.NOT_REPRODUCED
    beyond = hoffer.matched_loss_test(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.93}, recipe_loss=1e-5))
    assert beyond.verdict == Verdict.NOT_TESTABLE and "extend the ladder" in beyond.why and not beyond.extend_seeds
    failed = hoffer.matched_loss_test(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.93},
                                                      states={"sb_x2": ["ok", "ok", "ok", "ok", "timeout"]}))
    assert failed.verdict == Verdict.NOT_TESTABLE and failed.n_unfinished == 1
    diverged = hoffer.matched_loss_test(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.931},
                                                        states={"lb_sqrt_gbn_ra": ["diverged", *["ok"] * 4]}))
    assert diverged.low > -0.01 and diverged.n_recipe_diverged == 1 and diverged.verdict == Verdict.PARTLY
    wide = hoffer.matched_loss_test(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.925}, spread=SPREAD))
    assert wide.low < -0.01 < wide.high and wide.extend_seeds           # Delta_loss's interval contains -1 point
    with pytest.raises(ConfigError, match="no column 'train_loss'"):
        hoffer.matched_loss_test(_mechanism_runs({**ACC, "lb_sqrt_gbn_ra": 0.93}).drop(columns="train_loss"))
