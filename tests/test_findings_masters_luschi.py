"""Masters & Luschi: the stable lr range against batch size, on made-up sweeps with known answers."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bsresearch.config import ConfigError
from bsresearch.findings.masters_luschi import stable_lr_table, stable_range_plot, stable_range_trend

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
