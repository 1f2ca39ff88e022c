"""Keskar et al.: the interpolation between two runs and measurements over finished runs' weights."""
import math

import pandas as pd
import pytest
from conftest import tiny_config

from bsresearch import results
from bsresearch.config import ConfigError
from bsresearch.findings.keskar import interpolate_runs, keskar_test, paired_differences, tenth_of_data, verdict_table
from bsresearch.findings.runs import measure_each_run, measure_runs
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.keskar import paired_test_plot
from bsresearch.train import run


@pytest.fixture
def two_runs(tmp_path):
    a = run(tiny_config(batch_size=16, save_checkpoint=True), tmp_path / "a")
    b = run(tiny_config(batch_size=64, save_checkpoint=True), tmp_path / "b")
    return a, b


def test_interpolation_between_two_runs_passes_through_both(two_runs):
    a, b = two_runs
    table = interpolate_runs(a.run_dir, b.run_dir, alphas=[0.0, 0.5, 1.0])
    train = table[table.split == "train"].set_index("alpha")
    assert train.loc[0.0, "loss"] == pytest.approx(a.metrics["train_loss"], rel=1e-5)
    assert train.loc[1.0, "loss"] == pytest.approx(b.metrics["train_loss"], rel=1e-5)
    assert set(table.split) == {"train", "test"} and len(table) == 6


def test_interpolation_refuses_different_architectures(tmp_path, two_runs):
    c = run(tiny_config(width=8, save_checkpoint=True), tmp_path / "c")
    with pytest.raises(ConfigError, match="differ in \\['width'\\]"):
        interpolate_runs(two_runs[0].run_dir, c.run_dir)


def test_measure_runs_applies_a_function_to_every_runs_final_weights(two_runs):
    from bsresearch.engine import evaluate
    runs = results.load(two_runs[0].run_dir.parent, all_runs=True)
    table = measure_runs(runs, lambda model, data, cfg: {"remeasured": evaluate(model, data.x_train, data.y_train)[0],
                                                        "batch": cfg.batch_size})
    merged = runs.merge(table, on="run_id")
    assert list(merged["remeasured"]) == pytest.approx(list(merged["train_loss"]), rel=1e-6)
    assert sorted(merged["batch"]) == [16, 64]



def test_measure_each_run_hands_the_measurement_the_runs_row_in_the_tables_order(two_runs):
    runs = results.load(two_runs[0].run_dir.parent, all_runs=True).sort_values("batch_size", ascending=False)
    table = measure_each_run(runs, lambda run, model, data, cfg: {"batch": run["batch_size"], "cfg": cfg.batch_size,
                                                                  "n": len(data.x_train)})
    assert list(table.columns) == ["batch", "cfg", "n"] and list(table["batch"]) == [64, 16]
    assert list(table["cfg"]) == [64, 16] and table["n"].nunique() == 1

# ----------------------------------------------------------------------------- the pre-registered test
def _table(phi_sb, phi_lb, acc_sb, acc_lb, n_train=4000, sb=32, lb=400):
    rows = []
    for seed, (ps, pl, a_s, a_l) in enumerate(zip(phi_sb, phi_lb, acc_sb, acc_lb)):
        rows += [{"batch_size": sb, "seed": seed, "state": "ok", "reached_target": True, "n_train": n_train,
                  "keskar_phi_eps1e-3": ps, "test_acc": a_s},
                 {"batch_size": lb, "seed": seed, "state": "ok", "reached_target": True, "n_train": n_train,
                  "keskar_phi_eps1e-3": pl, "test_acc": a_l},
                 {"batch_size": n_train, "seed": seed, "state": "ok", "reached_target": True, "n_train": n_train,
                  "keskar_phi_eps1e-3": 1.0, "test_acc": 0.5}]
    return pd.DataFrame(rows)


def test_keskar_ratio_is_the_geometric_mean_with_a_t_interval_on_log_ratios():
    # per-seed ratios 2, 8, 4: log ratios ln2 * (1, 3, 2), mean 2 ln2 -> ratio 4 (the arithmetic mean is 4.67);
    # std ln2, t(0.975, 2) = 4.302653 -> half-width 4.302653 ln2 / sqrt 3
    table = _table([1, 1, 2], [2, 8, 8], [0.90, 0.92, 0.91], [0.88, 0.91, 0.87])
    test = keskar_test(table, 32, 400)
    half = 4.302653 * math.log(2) / math.sqrt(3)
    assert test.ratio == pytest.approx(4.0)
    assert test.ratio_low == pytest.approx(4 * math.exp(-half), rel=1e-5)
    assert test.ratio_high == pytest.approx(4 * math.exp(half), rel=1e-5)
    # drops 0.02, 0.01, 0.04: mean 0.0233, std 0.015275
    assert test.drop == pytest.approx(0.07 / 3)
    assert test.drop_low == pytest.approx(0.07 / 3 - 4.302653 * 0.0152753 / math.sqrt(3), rel=1e-4)
    assert test.n_pairs == 3 and test.largest_b_over_n == pytest.approx(0.1)
    # ratio interval [4 exp(-1.72), ...] = [0.72, ...] contains 1; the drop's lower end 0.0233 - 0.0379 < 0
    assert test.verdict == Verdict.NOT_REPRODUCED
    assert test.extend_seeds   # both intervals contain their thresholds with 3 seeds


@pytest.mark.parametrize("ratios, drops, verdict", [
    ([10, 12, 11, 9, 10], [0.02, 0.03, 0.02, 0.025, 0.03], Verdict.REPRODUCED),
    ([10, 12, 11, 9, 10], [0.02, -0.03, 0.02, -0.025, 0.03], Verdict.PARTLY),
    ([0.5, 3, 1, 2, 0.8], [0.02, 0.03, 0.02, 0.025, 0.03], Verdict.PARTLY),
    ([0.5, 3, 1, 2, 0.8], [0.02, -0.03, 0.02, -0.025, 0.03], Verdict.NOT_REPRODUCED),
])
def test_keskar_verdicts_follow_the_protocol(ratios, drops, verdict):
    table = _table([1.0] * 5, ratios, [0.9] * 5, [0.9 - d for d in drops])
    test = keskar_test(table, 32, 400)
    assert test.verdict == verdict
    assert test.extend_seeds == (verdict != Verdict.REPRODUCED)   # the non-reproduced cases straddle a threshold
    shown = verdict_table(test)
    assert list(shown["verdict"]) == [verdict] * 2 and shown["statistic"].iloc[0].startswith("R:")


def test_the_paired_figure_draws_each_seeds_difference_the_estimate_and_the_threshold():
    import matplotlib.pyplot as plt
    table = _table([1, 1, 2], [2, 8, 8], [0.90, 0.92, 0.91], [0.88, 0.91, 0.87])
    pairs = paired_differences(table, 32, 400)
    assert list(pairs["ratio"]) == [2, 8, 4] and list(pairs["drop"]) == pytest.approx([0.02, 0.01, 0.04])
    test = keskar_test(table, 32, 400)
    fig, (ax_ratio, ax_drop) = plt.subplots(1, 2)
    paired_test_plot(ax_ratio, ax_drop, pairs, test)
    assert list(ax_ratio.collections[0].get_offsets()[:, 1]) == [2, 8, 4]          # one point per seed
    assert list(ax_drop.collections[0].get_offsets()[:, 1]) == pytest.approx([2, 1, 4])   # in points
    thresholds = [[ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label().startswith("threshold")]
                  for ax in (ax_ratio, ax_drop)]
    assert thresholds == [[1.0], [0.0]]
    estimate = [ln for ln in ax_ratio.get_lines() if ln.get_marker() == "D"][0]
    assert estimate.get_ydata()[0] == pytest.approx(test.ratio) and ax_ratio.get_yscale() == "log"
    plt.close(fig)


def test_keskar_is_not_testable_when_a_run_missed_its_target_or_failed():
    table = _table([1.0] * 5, [10, 12, 11, 9, 10], [0.9] * 5, [0.88] * 5)
    table.loc[(table.batch_size == 400) & (table.seed == 2), "reached_target"] = False
    test = keskar_test(table, 32, 400)
    assert test.verdict == Verdict.NOT_TESTABLE and "seed 2: did not reach its target" in test.problems[0]
    table.loc[(table.batch_size == 32) & (table.seed == 0), "state"] = "failed"
    assert keskar_test(table, 32, 400).n_pairs == 4
    # the full batch's runs are not part of the primary test: a failure there does not block it
    ok = _table([1.0] * 5, [10, 12, 11, 9, 10], [0.9] * 5, [0.88] * 5)
    ok.loc[ok.batch_size == 4000, "state"] = "failed"
    assert keskar_test(ok, 32, 400).verdict != Verdict.NOT_TESTABLE


def test_large_batch_is_the_batch_size_closest_to_a_tenth_of_the_data():
    assert tenth_of_data(_table([1] * 2, [1] * 2, [1] * 2, [1] * 2)) == 400
    assert tenth_of_data(_table([1] * 2, [1] * 2, [1] * 2, [1] * 2, n_train=10000, sb=256, lb=1000)) == 1000
    with pytest.raises(ConfigError, match="n_train"):
        tenth_of_data(_table([1] * 2, [1] * 2, [1] * 2, [1] * 2).drop(columns="n_train"))
