"""Hoffer et al.: the log(t) distance fit, the ingredients of the recipe and their figures, on made-up tables."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from conftest import variant_rows

from bsresearch import stats
from bsresearch.findings import hoffer
from bsresearch.findings.hoffer import distance_vs_steps, variant_points
from bsresearch.plots.sweeps import variant_colors


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
    t = np.array([0, 1, 10, 100, 1000, 10_000, 100_000.0])
    d = np.array([0.0, -1.0, 1.0, 2.0, 3.0, 50.0, 99.0])   # d = log10 t on [10, 1000]; junk outside
    fit = hoffer.fit_log_time(t, d, t_min=10, t_max=1000)
    assert fit.n_points == 3 and fit.slope == pytest.approx(1 / math.log(10)) and fit.r2 == pytest.approx(1.0)
    few = hoffer.fit_log_time([10, 100], [1.0, 2.0])
    assert few.n_points == 2 and math.isnan(few.slope) and math.isnan(few.r2)


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
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a", "c"]
    assert list(ax.get_yticks()) == [2, 1, 0]
    means = ax.get_lines()[0]
    assert list(means.get_ydata()) == [2, 1, 0] and means.get_xdata() == pytest.approx([0.9] * 3)
    plt.close(fig)


def test_distance_vs_steps_draws_means_and_fitted_lines_on_a_log_axis():
    hist = pd.DataFrame(_history("sb", 0, 2.0) + _history("sb", 1, 4.0) + _history("lb", 0, 0.5))
    fits = hoffer.distance_fits(hist, t_min=2)
    fig, ax = plt.subplots()
    distance_vs_steps(ax, hist, fits, order=["sb", "lb"])
    assert ax.get_xscale() == "log"
    solid = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_label().split()[0] for line in solid] == ["sb", "lb"] and len(dashed) == 2
    sb = solid[0]
    assert sb.get_xdata()[0] == 1 and sb.get_ydata()[-1] == pytest.approx(3.0 * math.log(100))  # mean of seeds
    assert dashed[0].get_ydata()[-1] == pytest.approx(3.0 * math.log(100))                     # mean fit
    assert "R$^2$ 1.000" in sb.get_label()
    plt.close(fig)
    fixed = variant_colors(["x", "lb", "sb"])          # one colour per variant across figures
    fig, ax = plt.subplots()
    distance_vs_steps(ax, hist, fits, order=["sb", "lb"], colors=fixed)
    solid = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert [line.get_color() for line in solid] == [fixed["sb"], fixed["lb"]]
    plt.close(fig)
