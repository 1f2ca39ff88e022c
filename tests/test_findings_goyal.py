"""Goyal et al.: where a scaling rule breaks, comparisons against the base batch, the figure; made-up tables."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from conftest import variant_rows

from bsresearch import stats
from bsresearch.config import ConfigError
from bsresearch.findings import goyal
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings import goyal as goyal_plots
from bsresearch.plots.findings.goyal import rule_vs_batch


def test_breaking_batch_finds_the_first_drop_or_divergence():
    table = stats.summarize_states(variant_rows(), ["variant", "batch_size"], ["test_acc"])
    verdict = goyal.breaking_batch(table, "test_acc", drop=0.01).set_index("variant")
    assert verdict.loc["a", "first_broken"] == 32 and verdict.loc["a", "largest_ok"] == 8
    assert verdict.loc["a", "broken"] == (32,) and "< baseline" in verdict.loc["a", "why"]
    assert verdict.loc["b", "first_broken"] == 128 and verdict.loc["b", "largest_ok"] == 32
    assert "1 of 3 seeds diverged" in verdict.loc["b", "why"]
    assert math.isnan(verdict.loc["c", "first_broken"]) and verdict.loc["c", "largest_ok"] == 128
    assert verdict.loc["d", "first_broken"] == 8 and math.isnan(verdict.loc["d", "largest_ok"])
    assert verdict.loc["a", "baseline"] == pytest.approx(0.9)
    looser = goyal.breaking_batch(table, "test_acc", drop=0.02).set_index("variant")
    assert math.isnan(looser.loc["a", "first_broken"])
    with pytest.raises(ConfigError, match="test_acc_mean"):
        goyal.breaking_batch(table.drop(columns="test_acc_mean"))


def test_versus_reference_and_versus_baseline_batch_use_finished_runs_only():
    rows = variant_rows()
    vs = stats.versus_reference(rows[rows["batch_size"] == 32], "test_acc", {"variant": "c"})
    a = vs.set_index("variant").loc["a"]
    assert a["diff"] == pytest.approx(-0.006) and a["low"] < a["diff"] < a["high"] and a["n_reference"] == 3
    per_batch = goyal.versus_baseline_batch(rows, "test_acc", baseline_batch=8).set_index(["variant", "batch_size"])
    assert per_batch.loc[("a", 32), "diff"] == pytest.approx(-0.015)
    assert per_batch.loc[("a", 8), "diff"] == pytest.approx(0.0)
    assert per_batch.loc[("b", 128), "n"] == 2                     # the diverged seed is not a number
    assert ("d", 8) not in per_batch.index                         # nothing finished


def test_rule_vs_batch_draws_a_line_per_rule_and_marks_divergence():
    rows = variant_rows()
    table = stats.summarize_states(rows, ["variant", "batch_size"], ["test_acc"])
    fig, ax = plt.subplots()
    assert rule_vs_batch(ax, rows, table, "test_acc", order=["c", "b", "a", "d"]) is ax
    legend = ax.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == ["c", "b", "a", "diverged (one x per seed)"]   # d never finished: no line
    lines = {str(c.get_label()): c[0] for c in ax.containers}   # errorbar: (data line, caps, bars)
    assert sorted(lines) == ["a", "b", "c"] and all(len(np.asarray(line.get_xdata())) == 3 for line in lines.values())
    a = lines["a"]
    assert np.asarray(a.get_ydata())[1] == pytest.approx(0.885)
    assert np.asarray(a.get_xdata())[1] == pytest.approx(32, rel=0.1)
    crosses = {str(c.get_label()): len(np.asarray(c.get_offsets())) for c in ax.collections
               if str(c.get_label()).startswith("_diverged")}
    assert crosses == {"_diverged b": 1, "_diverged d": 9}
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [8, 32, 128]
    plt.close(fig)


# ----------------------------------------------------------------------------- the pre-registered test: B*
SPREAD = np.array([-0.004, -0.002, 0.0, 0.002, 0.004])   # variance 1e-5: with 5 seeds each, se 0.002, dof 8
HALF = 2.306004 * 0.002                                    # t(0.975, 8) x se


def _rule_rows(drops: dict[int, float], states: dict[int, list[str]] | None = None, rule: str = "linear_warmup"):
    rows = []
    for b, drop in drops.items():
        for seed, noise in enumerate(SPREAD):
            state = (states or {}).get(b, ["ok"] * 5)[seed]
            rows.append({"variant": rule, "batch_size": b, "seed": seed, "state": state,
                         "test_acc": 0.95 - drop + noise if state == "ok" else 0.1})
    return pd.DataFrame(rows)


def test_holding_batches_by_hand_and_against_scipy():
    from scipy import stats as sps
    rows = _rule_rows({32: 0, 80: 0, 160: 0.004, 400: 0.007, 800: 0})
    per = goyal.holding_batches(rows, "linear_warmup").set_index("batch_size")
    assert per.loc[160, "diff"] == pytest.approx(-0.004)
    assert (per.loc[160, "low"], per.loc[160, "high"]) == pytest.approx((-0.004 - HALF, -0.004 + HALF), rel=1e-6)
    oracle = sps.ttest_ind(0.943 + SPREAD, 0.95 + SPREAD, equal_var=False).confidence_interval(0.95)
    assert (per.loc[400, "low"], per.loc[400, "high"]) == pytest.approx((oracle.low, oracle.high))
    assert list(per["holds"]) == [True, True, True, False, True] and per.loc[32, "why"] == "the baseline"


def test_scaling_test_b_star_is_the_last_batch_before_the_first_failure():
    rows = _rule_rows({32: 0, 80: 0, 160: 0.004, 400: 0.007, 800: 0})   # 400: lower end -1.16 points
    test = goyal.scaling_test(rows, "linear_warmup")
    assert (test.b_star, test.first_failing, test.b_star_over_base) == (160, 400, 5)
    assert test.verdict == Verdict.PARTLY and "-1.16" in test.why
    assert test.extend_seeds                       # 400's interval [-1.16, -0.24] contains -1 point, 5 seeds
    held = goyal.scaling_test(_rule_rows({32: 0, 80: 0, 160: 0, 400: 0.004, 800: 0.004}))
    assert held.b_star == 800 and held.verdict == Verdict.REPRODUCED and math.isnan(held.first_failing)
    assert not held.extend_seeds                   # lowest lower end -0.86 points: no interval contains -1


def test_scaling_test_divergence_unfinished_runs_and_thresholds():
    diverged = goyal.scaling_test(_rule_rows({32: 0, 80: 0, 160: 0}, {80: ["diverged"] + ["ok"] * 4}))
    assert diverged.b_star == 32 and diverged.first_failing == 80 and diverged.verdict == Verdict.NOT_REPRODUCED
    assert "1 of 5 seeds diverged" in diverged.why
    failed = goyal.scaling_test(_rule_rows({32: 0, 80: 0}, {80: ["failed"] + ["ok"] * 4}))
    assert failed.verdict == Verdict.NOT_TESTABLE and math.isnan(failed.b_star)
    assert goyal.scaling_test(_rule_rows({32: 0, 80: 0}, rule="none"), "linear_warmup").verdict == Verdict.NOT_TESTABLE
    strict = goyal.scaling_test(_rule_rows({32: 0, 80: 0, 160: 0}), reproduced_at=200, partly_at=160)
    assert strict.b_star == 160 and strict.verdict == Verdict.PARTLY
    with pytest.raises(ConfigError, match="no column 'state'"):
        goyal.holding_batches(_rule_rows({32: 0}).drop(columns="state"), "linear_warmup")


# ----------------------------------------------------------------------------- figures
def test_difference_vs_batch_keeps_every_interval_inside_the_axes():
    rows = pd.concat([_rule_rows({32: 0, 80: 0, 400: 0.05}),
                      _rule_rows({32: 0, 80: 0.002, 400: 0.3}, {400: ["diverged"] + ["ok"] * 4}, rule="none")])
    diffs = goyal.versus_baseline_batch(rows, "test_acc", 32)
    fig, ax = plt.subplots()
    goyal_plots.difference_vs_batch(ax, rows, diffs, margin=0.01, order=["linear_warmup", "none"])
    bottom, top = ax.get_ylim()
    assert bottom < 100 * diffs["low"].min() and top > 100 * diffs["high"].max() and bottom < -1 < top
    threshold = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert len(threshold) == 1 and list(np.asarray(threshold[0].get_ydata())) == [-1.0, -1.0]
    crosses = [c for c in ax.collections if str(c.get_label()).startswith("_diverged")]
    assert len(crosses) == 1 and len(np.asarray(crosses[0].get_offsets())) == 1
    # readable: with a collapse of 30 points on the axis, the -1 point threshold still sits well apart from 0
    frac = ax.transLimits.transform   # data -> axes fraction, through the y scale
    gap = abs(frac(ax.transScale.transform((1.0, -1.0)))[1] - frac(ax.transScale.transform((1.0, 0.0)))[1])
    assert 100 * diffs["diff"].min() < -25 and gap > 0.08
    assert ax.get_yscale() == "symlog" and bottom < 100 * diffs["low"].min()   # the collapse stays on the axes
    plt.close(fig)


def test_limits_from_intervals_pads_the_range():
    fig, ax = plt.subplots()
    goyal_plots.limits_from_intervals(ax, [[0.0, np.nan]], [[10.0]], pad=0.1)
    assert ax.get_ylim() == pytest.approx((-1.0, 11.0))
    goyal_plots.limits_from_intervals(ax, [[1.0]], [[100.0]], log=True, pad=0.5)
    assert ax.get_ylim() == pytest.approx((0.1, 1000.0))
    plt.close(fig)


def test_curves_by_batch_band_is_the_t_interval_over_seeds():
    history = pd.DataFrame({"batch_size": [32] * 6 + [80] * 2, "epoch": [1, 1, 1, 2, 2, 2, 1, 2],
                            "train_loss": [1.0, 2.0, 3.0, 0.5, 0.5, 0.5, 1.0, 0.5]})
    fig, ax = plt.subplots()
    goyal_plots.curves_by_batch(ax, history, "train_loss", log_y=False)
    line = ax.get_lines()[0]
    assert list(np.asarray(line.get_ydata())) == [2.0, 0.5] and line.get_label() == "32"
    band = np.asarray(ax.collections[0].get_paths()[0].vertices)[:, 1]
    half = 4.302653 / math.sqrt(3)                       # t(0.975, 2) x std 1 / sqrt(3)
    assert band.min() == pytest.approx(2.0 - half, rel=1e-5) and band.max() == pytest.approx(2.0 + half, rel=1e-5)
    plt.close(fig)


def test_the_baselines_own_interval_does_not_ask_for_more_seeds():
    rows = _rule_rows({32: 0, 80: -0.01})
    rows.loc[rows["batch_size"] == 32, "test_acc"] = 0.95 + 3 * SPREAD   # 32 against itself: [-1.38, +1.38] points
    test = goyal.scaling_test(rows)
    per = goyal.holding_batches(rows, "linear_warmup").set_index("batch_size")
    assert per.loc[32, "low"] < -0.01 < per.loc[32, "high"] and per.loc[80, "low"] > -0.01
    assert test.b_star == 80 and not test.extend_seeds


def test_eight_seeds_at_the_deciding_batches_need_no_more_even_if_a_later_batch_diverged():
    noise = np.linspace(-0.006, 0.006, 8)
    rows = pd.DataFrame([{"variant": "linear_warmup", "batch_size": b, "seed": seed,
                          "state": "diverged" if (b == 4000 and seed == 0) else "ok",
                          "test_acc": 0.95 - drop + noise[seed]}
                         for b, drop in {32: 0.0, 80: 0.0, 160: 0.008, 4000: 0.5}.items() for seed in range(8)])
    per = goyal.holding_batches(rows, "linear_warmup").set_index("batch_size")
    assert per.loc[160, "low"] < -0.01 < per.loc[160, "high"]        # 160 decides, its interval contains -1 point
    test = goyal.scaling_test(rows)
    assert (test.b_star, test.first_failing) == (80, 160) and not test.extend_seeds
    five = goyal.scaling_test(rows[rows["seed"] < 5])
    assert five.b_star == 80 and five.extend_seeds                    # the same with 5 seeds asks for 8


# ----------------------------------------------------------------------------- lr ceiling or batch limit (protocol v4)
BATCHES = [32, 160, 800, 2000, 4000, 8000]


def _grid_runs(penalty, ceiling=2.0, slope=0.002, seeds=range(5)):
    """Goyal's grid: the linear lr 0.05 B / 32 and 4 factors of 2 below it at every B > 32, lr 0.05 at B = 32.
    Test accuracy 0.98 - penalty(B) - slope x (octaves below the linear lr) + seed spread; above `ceiling` the run
    ends at chance (0.1, state ok), above twice the ceiling it diverges (no accuracy)."""
    rows = []
    for b in BATCHES:
        for k in ([0] if b == 32 else range(5)):
            lr = 0.05 * b / 32 / 2 ** k
            for s in seeds:
                diverged = lr > 2 * ceiling
                acc = 0.1 if lr > ceiling else 0.98 - penalty(b) - slope * k + 0.001 * (s - 2)
                rows.append({"batch_size": b, "effective_lr": lr, "seed": s,
                             "state": "diverged" if diverged else "ok", "test_acc": math.nan if diverged else acc})
    return pd.DataFrame(rows)


def test_lr_ceiling_test_partly_when_the_linear_break_is_an_lr_ceiling_and_the_batch_limit_lies_beyond():
    test = goyal.lr_ceiling_test(_grid_runs(lambda b: {4000: 0.03, 8000: 0.1}.get(b, 0.0)), n_train=40000)
    assert (test.linear.b_star, test.b_fail, test.fail_kind) == (800, 2000, "lr ceiling")
    assert (test.best.b_star, test.best.first_failing) == (2000, 4000)
    assert test.fraction_linear == pytest.approx(0.02) and test.fraction_best == pytest.approx(0.05)
    per = test.per_batch.set_index("batch_size")
    assert per.loc[2000, "best_lr"] == pytest.approx(3.125 / 2) and per.loc[2000, "linear_lr"] == pytest.approx(3.125)
    assert per.loc[4000, "best_lr"] == pytest.approx(6.25 / 4) and not per["best_at_bottom"].any()
    # the largest lr at which every seed learns: the linear lr up to 800, then the grid's last lr under 2.0
    assert per["lr_ceiling"].to_numpy() == pytest.approx([0.05, 0.25, 1.25, 1.5625, 1.5625, 1.5625])
    assert not per.loc[2000, "linear_holds"] and per.loc[2000, "best_holds"] and not per.loc[4000, "best_holds"]
    assert test.verdict == Verdict.PARTLY and "lr ceiling" in test.why and not test.extend_seeds


def test_lr_ceiling_test_reproduced_when_no_lr_rescues_the_first_failing_batch():
    test = goyal.lr_ceiling_test(_grid_runs(lambda b: 0.05 if b >= 2000 else 0.0, ceiling=100.0), n_train=40000)
    assert (test.linear.b_star, test.b_fail, test.fail_kind, test.best.b_star) == (800, 2000, "batch", 800)
    assert test.verdict == Verdict.REPRODUCED
    # the same curve on 4000 examples: B* = 800 is B/N = 0.2, but on 400 000 examples B*/N = 0.002 < 0.0064
    assert goyal.lr_ceiling_test(_grid_runs(lambda b: 0.05 if b >= 2000 else 0.0, ceiling=100.0),
                                 n_train=400_000).verdict == Verdict.PARTLY


def test_lr_ceiling_test_not_reproduced_and_not_testable():
    ceiling_only = goyal.lr_ceiling_test(_grid_runs(lambda b: 0.0), n_train=40000)
    assert ceiling_only.fail_kind == "lr ceiling" and math.isnan(ceiling_only.best.first_failing)
    assert ceiling_only.verdict == Verdict.NOT_REPRODUCED
    never = goyal.lr_ceiling_test(_grid_runs(lambda b: 0.0, ceiling=1e6), n_train=40000)
    assert math.isnan(never.b_fail) and never.verdict == Verdict.NOT_TESTABLE and "no break" in never.why
    bottom = goyal.lr_ceiling_test(_grid_runs(lambda b: 0.0, slope=-0.002), n_train=40000)   # smaller lr better
    assert bottom.per_batch["best_at_bottom"].iloc[1:].all() and bottom.verdict == Verdict.NOT_TESTABLE
    pending = _grid_runs(lambda b: 0.0)
    pending.loc[0, "state"] = "timeout"
    assert goyal.lr_ceiling_test(pending, n_train=40000).verdict == Verdict.NOT_TESTABLE
    with pytest.raises(ConfigError, match="no column 'effective_lr'"):
        goyal.lr_ceiling_test(pending.drop(columns="effective_lr"), n_train=40000)


def test_lr_ceiling_test_judges_each_seed_at_the_lr_chosen_on_the_other_seeds():
    rows = [{"batch_size": 32, "effective_lr": 0.05, "seed": s, "state": "ok", "test_acc": 0.96 + 0.001 * (s - 2)}
            for s in range(5)]
    accs = {3.125: [0.1] * 5, 1.5625: [1.00, 0.94, 0.94, 0.94, 0.94], 0.78125: [0.95] * 5}
    rows += [{"batch_size": 2000, "effective_lr": lr, "seed": s, "state": "ok", "test_acc": acc}
             for lr, values in accs.items() for s, acc in enumerate(values)]
    test = goyal.lr_ceiling_test(pd.DataFrame(rows), n_train=40000)
    per = test.per_batch.set_index("batch_size").loc[2000]
    assert per["best_lr"] == 1.5625                      # on all five seeds: mean 0.952 against 0.95
    # without seed 0, 1.5625 averages 0.94 < 0.95; without any other seed, (1.00 + 3 x 0.94) / 4 = 0.955 > 0.95
    assert per["held_out_lrs"] == (0.78125, 1.5625, 1.5625, 1.5625, 1.5625)
    assert per["best_diff"] == pytest.approx(np.mean([0.95, 0.94, 0.94, 0.94, 0.94]) - 0.96)
    assert test.fail_kind == "batch" and test.b_fail == 2000
