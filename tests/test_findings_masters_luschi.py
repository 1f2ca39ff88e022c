"""Masters & Luschi: the stable lr range against batch size, on made-up sweeps with known answers."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bsresearch import stats
from bsresearch.config import ConfigError
from bsresearch.findings.masters_luschi import (
    Trend,
    range_test,
    stable_lr_intervals,
    stable_lr_table,
    stable_range_trend,
)
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.masters_luschi import accuracy_vs_lr_plot, stable_range_plot, window_width_plot

LRS = [2.0 ** k for k in range(-8, 1)]   # 2^-8 .. 1


def sweep(batch_sizes=(8, 32, 128, 512), seeds=(0, 1, 2, 3, 4), noise=0.002):
    """Accuracy peaks at lr* = 2^-2 / sqrt(B/8) (one octave lower per 4x B), a parabola in log2(lr) whose
    width halves per 4x B; lrs above 2 lr* diverge. So the window and the largest stable lr shrink with B."""
    rng = np.random.default_rng(0)
    rows = []
    for b in batch_sizes:
        peak = math.log2(0.25 / math.sqrt(b / 8))
        width = 4.0 / math.sqrt(b / 8)
        for lr in LRS:
            for s in seeds:
                diverged = math.log2(lr) > peak + 1
                acc = 0.9 - 0.04 * ((math.log2(lr) - peak) / width) ** 2 + noise * rng.standard_normal()
                rows.append({"batch_size": b, "lr": lr, "seed": s, "state": "diverged" if diverged else "ok",
                             "test_acc": math.nan if diverged else acc})
    return pd.DataFrame(rows)


def test_table_finds_the_largest_stable_lr_the_best_lr_and_the_window():
    table = stable_lr_table(sweep(noise=0.0), "test_acc", margin=0.011).set_index("batch_size")
    assert list(table["max_stable_lr"]) == [0.5, 0.25, 0.125, 2.0 ** -4]
    assert list(table["best_lr"]) == [0.25, 0.125, 2.0 ** -4, 2.0 ** -5]
    # within 0.011 of the best: |log2(lr) - peak| <= width / 2, and never past the divergence boundary
    assert list(table["window_lrs"]) == [4, 3, 1, 1]          # B=8: 2^-4 .. 2^-1 (2^0 diverges)
    assert list(table["window_octaves"]) == [3.0, 2.0, 0.0, 0.0]
    assert (table.loc[8, "window_low"], table.loc[8, "window_high"]) == (2.0 ** -4, 0.5)
    assert table["unstable_in_grid"].all() and not table["best_at_edge"].any()


def test_crashed_runs_are_left_out_and_a_nan_metric_counts_as_diverged():
    runs = sweep(noise=0.0)
    crashed = runs.assign(state=np.where((runs["lr"] == 2.0 ** -6) & (runs["seed"] == 0), "failed", runs["state"]))
    assert stable_lr_table(crashed).equals(stable_lr_table(runs))
    nan = runs.copy()
    nan.loc[(nan["batch_size"] == 8) & (nan["lr"] == 0.5) & (nan["seed"] == 3), "test_acc"] = math.nan
    assert stable_lr_table(nan).set_index("batch_size").loc[8, "max_stable_lr"] == 0.25


def test_trend_slopes_have_bootstrap_intervals_over_seeds():
    trend = stable_range_trend(sweep(), "test_acc", margin=0.011, n_boot=100)
    max_stable, window = trend["max_stable_lr"], trend["window_octaves"]
    # max stable lr halves per 4x batch: slope -0.5 in log2-log2
    assert max_stable.slope == pytest.approx(-0.5, abs=0.01) and max_stable.n_batch_sizes == 4
    assert window.slope < 0 and window.high < 0 and window.low <= window.slope <= window.high
    with pytest.raises(ConfigError, match="2 or more seeds"):
        stable_range_trend(sweep(seeds=(0,)))


def test_plot_draws_the_window_best_and_boundary():
    fig, ax = plt.subplots()
    assert stable_range_plot(ax, stable_lr_table(sweep())) is ax
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"
    boundary = [line for line in ax.get_lines() if line.get_label() == "largest lr without divergence"]
    assert len(boundary) == 1 and list(boundary[0].get_ydata()) == [0.5, 0.25, 0.125, 2.0 ** -4]
    plt.close(fig)


def test_intervals_per_batch_size_bracket_the_point_values_and_are_exact_without_noise():
    runs = sweep(noise=0.0)
    point = stable_lr_table(runs, margin=0.011).set_index("batch_size")
    # every seed identical: each resample gives the same table, so each interval is the point value
    exact = stable_lr_intervals(runs, margin=0.011, n_boot=20).set_index("batch_size")
    for c in ("max_stable_lr", "best_lr", "window_octaves"):
        assert list(exact[f"{c}_low"]) == list(point[c]) == list(exact[f"{c}_high"])
    noisy = stable_lr_intervals(sweep(noise=0.01), margin=0.011, n_boot=20).set_index("batch_size")
    assert (noisy["window_octaves_low"] <= noisy["window_octaves_high"]).all()
    with pytest.raises(ConfigError, match="stable_lr_intervals needs runs of 2 or more seeds"):
        stable_lr_intervals(sweep(seeds=(0,)))


def trend(column, low, high):
    return Trend(column, (low + high) / 2, low, high, 0.95, 100, 4)


def test_the_verdict_follows_both_intervals_and_the_validity_checks():
    table = stable_lr_table(sweep(noise=0.0), margin=0.011)
    both = {"max_stable_lr": trend("max_stable_lr", -0.6, -0.4), "window_octaves": trend("window_octaves", -1, -0.2)}
    assert range_test(table, both).verdict == Verdict.REPRODUCED and range_test(table, both).reason == ""
    one = {**both, "window_octaves": trend("window_octaves", -0.5, 0.3)}
    assert range_test(table, one).verdict == Verdict.PARTLY
    none = {"max_stable_lr": trend("max_stable_lr", -0.1, 0.2), "window_octaves": trend("window_octaves", 0.0, 1.0)}
    assert range_test(table, none).verdict == Verdict.NOT_REPRODUCED
    # a slope of 0 that the fit returns as -3e-16 (every resample alike) is not below 0
    flat = {**both, "window_octaves": trend("window_octaves", -3e-16, -3e-16)}
    assert range_test(table, flat).verdict == Verdict.PARTLY
    # at B = 512 no lr diverges once the grid stops below the boundary: the boundary is not measured there
    cut = sweep(noise=0.0)
    cut = cut[~((cut["batch_size"] == 512) & (cut["lr"] > 2.0 ** -4))]
    result = range_test(stable_lr_table(cut, margin=0.011), both)
    assert result.verdict == Verdict.NOT_TESTABLE and result.reason == "no lr of the grid diverged at B = 512"
    edge = table.assign(best_at_edge=table["batch_size"] == 8)
    assert range_test(edge, both).reason == "the best lr is at the grid's edge at B = 8"


def test_the_pipeline_the_notebook_runs_gives_reproduced_on_a_shrinking_range():
    runs = sweep(noise=0.002)
    table = stable_lr_table(runs, margin=0.011)
    test = range_test(table, stable_range_trend(runs, margin=0.011, n_boot=40))
    assert test.verdict == Verdict.REPRODUCED and test.max_stable_lr.high < 0 and test.window_octaves.high < 0
    # the same runs with the boundary and the window growing with B instead: not reproduced
    grown = runs.assign(batch_size=runs["batch_size"].map({8: 512, 32: 128, 128: 32, 512: 8}))
    assert range_test(stable_lr_table(grown, margin=0.011),
                      stable_range_trend(grown, margin=0.011, n_boot=40)).verdict == Verdict.NOT_REPRODUCED
    text = stats.frame_markdown(table)
    assert text.splitlines()[0].startswith("| batch_size | n_lrs | max_stable_lr") and len(text.splitlines()) == 6


def test_accuracy_plot_marks_diverged_lrs_and_width_plot_draws_the_trend():
    runs = sweep(batch_sizes=(8, 32), noise=0.0)
    fig, (a, b) = plt.subplots(1, 2)
    accuracy_vs_lr_plot(a, runs)
    lines = {line.get_label(): line for line in a.get_lines()}
    y = np.asarray(lines["B = 8"].get_ydata(), float)
    assert np.isnan(y[-1]) and np.isfinite(y[:-1]).all()             # 2^0 diverges at B = 8: no point, a break
    crosses = [line for line in a.get_lines() if line.get_marker() == "x" and len(line.get_xdata())]
    assert [list(c.get_xdata()) for c in crosses] == [[1.0], [0.5, 1.0]]
    table = stable_lr_table(sweep(noise=0.0), margin=0.011)
    window_width_plot(b, table, stable_lr_intervals(sweep(noise=0.0), margin=0.011, n_boot=10),
                      trend("window_octaves", -2.0, -1.0))
    fit = [line for line in b.get_lines() if line.get_label().startswith("slope")]
    assert len(fit) == 1 and fit[0].get_label() == "slope -1.50 per doubling [-2.00, -1.00]"
    plt.close(fig)


# ----------------------------------------------------------------------------- "stable" = learns (protocol v4)
def collapsing_sweep(batch_sizes=(8, 32, 128, 512), seeds=(0, 1, 2, 3, 4)):
    """Every B diverges above lr 2^-1 (a NaN, state diverged); below that, runs above lr_learn(B) = 2^-2 / sqrt(B/8)
    end at chance (0.1, state ok: no NaN), so only lrs up to lr_learn(B) learn. Learning runs peak one octave
    below lr_learn(B): 0.9 - 0.01 (octaves from the peak)^2."""
    rows = []
    for b in batch_sizes:
        top = math.log2(0.25 / math.sqrt(b / 8))
        for lr in LRS:
            for s in seeds:
                u = math.log2(lr)
                state = "diverged" if u > -1 else "ok"
                acc = math.nan if u > -1 else 0.1 if u > top else 0.9 - 0.01 * (u - top + 1) ** 2 + 0.001 * s
                rows.append({"batch_size": b, "lr": lr, "seed": s, "state": state, "test_acc": acc})
    return pd.DataFrame(rows)


def test_learns_makes_a_run_at_chance_unstable_and_leaves_the_default_unchanged():
    from bsresearch.findings.masters_luschi import LEARNS
    runs = collapsing_sweep()
    plain = stable_lr_table(runs).set_index("batch_size")
    assert stable_lr_table(runs).equals(stable_lr_table(runs, learns=None))
    assert list(plain["max_stable_lr"]) == [0.5] * 4                       # no NaN up to 2^-1: "stable"
    learning = stable_lr_table(runs, learns=LEARNS).set_index("batch_size")
    assert list(learning["max_stable_lr"]) == [0.25, 0.125, 0.0625, 0.03125]
    assert list(learning["best_lr"]) == [0.125, 0.0625, 0.03125, 2.0 ** -6]
    assert learning["unstable_in_grid"].all() and not learning["best_at_edge"].any()
    # one seed of a learning cell below the threshold makes that lr fail for the batch size
    one = runs.copy()
    one.loc[(one.batch_size == 8) & (one.lr == 0.25) & (one.seed == 4), "test_acc"] = 0.45
    assert stable_lr_table(one, learns=LEARNS).set_index("batch_size").loc[8, "max_stable_lr"] == 0.125


def test_the_largest_learning_lr_has_its_own_slope_and_verdict():
    runs = collapsing_sweep()
    plain = stable_range_trend(runs, n_boot=50)["max_stable_lr"]
    learning = stable_range_trend(runs, n_boot=50, learns=0.5)
    assert plain.slope == pytest.approx(0.0) and (plain.low, plain.high) == pytest.approx((0.0, 0.0), abs=1e-9)
    # log2(max learning lr) = -2 - (log2 B - 3) / 2: slope -0.5 per doubling, in every resample
    assert learning["max_stable_lr"].slope == pytest.approx(-0.5)
    assert (learning["max_stable_lr"].low, learning["max_stable_lr"].high) == pytest.approx((-0.5, -0.5))
    table = stable_lr_table(runs, learns=0.5)
    assert range_test(table, learning).max_stable_lr.slope == pytest.approx(-0.5)
    intervals = stable_lr_intervals(runs, n_boot=20, learns=0.5).set_index("batch_size")
    assert intervals.loc[512, "max_stable_lr_low"] == intervals.loc[512, "max_stable_lr_high"] == 0.03125


def test_learning_range_test_leaves_out_a_batch_size_where_nothing_learns():
    from bsresearch.findings.masters_luschi import learning_range_test
    runs = collapsing_sweep(batch_sizes=(8, 32, 128, 512, 2048))
    under = runs["batch_size"] == 2048                        # under-trained: every run below 0.5, none diverged
    runs.loc[under & (runs.state == "ok"), "test_acc"] = runs.loc[under & (runs.state == "ok"), "test_acc"].clip(
        upper=0.45)
    result = learning_range_test(runs, n_boot=50)
    assert result.no_learning == (2048.0,) and result.learns == 0.5
    assert math.isnan(result.table.set_index("batch_size").loc[2048, "max_stable_lr"])
    assert result.trend["max_stable_lr"].slope == pytest.approx(-0.5)   # from B 8 to 512, as without 2048
    # the largest learning lr falls, the window (2 octaves at every B) does not: one interval below 0
    assert result.test.verdict == Verdict.PARTLY and result.test.reason == ""
    few = learning_range_test(runs[runs.batch_size.isin([8, 32, 2048])], n_boot=20)
    assert few.test.verdict == Verdict.NOT_TESTABLE
    assert "2 batch sizes" in few.test.reason and "B = 2048" in few.test.reason
