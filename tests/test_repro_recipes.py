"""recipes.py and plots/recipes.py (Hoffer, Goyal reproductions): known answers on made-up tables."""
from __future__ import annotations

import math
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bsresearch import recipes
from bsresearch.config import ConfigError
from bsresearch.plots.recipes import distance_vs_steps, rule_vs_batch, variant_colors, variant_points
from bsresearch.sweep.spec import expand, parse_spec


# ----------------------------------------------------------------------------- distance vs log(steps)
def test_log_fit_recovers_a_logarithm_and_prefers_it_to_a_power_law():
    t = np.array([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000.0])
    fit = recipes.fit_log_time(t, 2.0 + 3.0 * np.log(t))
    assert fit.slope == pytest.approx(3.0) and fit.intercept == pytest.approx(2.0)
    assert fit.r2 == pytest.approx(1.0) and fit.r2_power < 0.99
    assert fit.n_points == 10 and (fit.t_min, fit.t_max) == (1.0, 1000.0)
    assert fit.predict(np.array([math.e])) == pytest.approx([5.0])


def test_power_fit_recovers_a_random_walk_and_the_log_model_fits_it_worse():
    t = np.geomspace(1, 1e4, 30)
    fit = recipes.fit_log_time(t, 0.5 * np.sqrt(t))
    assert fit.alpha == pytest.approx(0.5) and fit.scale == pytest.approx(0.5)
    assert fit.r2_power == pytest.approx(1.0) and fit.r2 < 0.9
    assert fit.predict_power(np.array([100.0])) == pytest.approx([5.0])


def test_log_fit_uses_only_the_range_and_positive_distances():
    t = np.array([0, 1, 10, 100, 1000, 10_000, 100_000.0])
    d = np.array([0.0, -1.0, 1.0, 2.0, 3.0, 50.0, 99.0])   # d = log10 t on [10, 1000]; junk outside
    fit = recipes.fit_log_time(t, d, t_min=10, t_max=1000)
    assert fit.n_points == 3 and fit.slope == pytest.approx(1 / math.log(10)) and fit.r2 == pytest.approx(1.0)
    few = recipes.fit_log_time([10, 100], [1.0, 2.0])
    assert few.n_points == 2 and math.isnan(few.slope) and math.isnan(few.r2)


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


def test_constant_lr_end_is_the_last_step_at_the_peak_lr():
    hist = pd.DataFrame(_history("a", 0, 1.0, decay_at=100, warmup=5))
    assert recipes.constant_lr_end(hist) == 100
    flat = pd.DataFrame(_history("a", 0, 1.0, decay_at=10_000))
    assert recipes.constant_lr_end(flat) == 400


def test_distance_fits_one_row_per_run_in_the_first_lr_phase():
    hist = pd.DataFrame(_history("sb", 0, 2.0) + _history("sb", 1, 2.0) + _history("lb", 0, 0.5))
    fits = recipes.distance_fits(hist, t_min=2)
    assert list(fits[["variant", "seed"]].itertuples(index=False, name=None)) == [("sb", 0), ("sb", 1), ("lb", 0)]
    assert fits["slope"].tolist() == pytest.approx([2.0, 2.0, 0.5])
    assert (fits["t_max"] == 100).all() and fits["r2"].tolist() == pytest.approx([1.0] * 3)
    whole = recipes.distance_fits(hist, t_min=2, first_phase=False)   # the plateau after the decay bends it
    assert (whole["t_max"] == 400).all() and (whole["r2"] < 0.99).all()


# ----------------------------------------------------------------------------- variants sharing a run
SPEC = {"name": "toy", "base": {"dataset": "synthetic", "train_size": 64, "model": "mlp", "base_batch_size": 8},
        "grid": {"batch_size": [8, 32]}, "seeds": 2,
        "variants": {"none": {"lr_scaling": "none"}, "linear": {"lr_scaling": "linear"},
                     "linear_warmup": {"lr_scaling": "linear", "warmup_epochs": 1}},
        "overrides": [{"where": {"batch_size": 8}, "set": {"lr_scaling": "none"}}]}


def test_runs_per_variant_gives_a_shared_run_to_every_variant_that_has_its_config():
    spec = parse_spec(SPEC)
    points = expand(spec)
    assert len(points) == 2 * (1 + 1 + 3)   # seeds x (batch 8: none = linear, warmup; batch 32: three rules)
    runs = pd.DataFrame([{"run_id": p.run_id, "state": "ok", "test_acc": i / 100, **p.coords}
                         for i, p in enumerate(points)])
    rows = recipes.runs_per_variant(runs.iloc[:-1], spec)  # the last point has not run
    assert len(rows) == 2 * 3 * 2 - 1
    shared = rows[(rows["batch_size"] == 8) & (rows["seed"] == 0) & rows["variant"].isin(["none", "linear"])]
    assert shared["run_id"].nunique() == 1 and sorted(shared["variant"]) == ["linear", "none"]
    warm = rows[(rows["variant"] == "linear_warmup") & (rows["batch_size"] == 8)]
    assert len(warm) == 2 and not set(warm["run_id"]) & set(shared["run_id"])
    assert recipes.variant_order(spec) == ["none", "linear", "linear_warmup"]
    plain = parse_spec({k: v for k, v in SPEC.items() if k not in ("variants", "overrides")})
    assert recipes.runs_per_variant(runs, plain).equals(runs)


# ----------------------------------------------------------------------------- where a rule breaks
def _rows():
    """Rule a: fine at 8, 1.5 points down at 32, fine again at 128. Rule b: a seed diverges at 128.
    Rule c: never breaks. Seeds 0-2, accuracies 0.90 +- 0.01."""
    rows = []
    for rule, b, drop, diverged in [("a", 8, 0, 0), ("a", 32, 0.015, 0), ("a", 128, 0.0, 0),
                                    ("b", 8, 0, 0), ("b", 32, 0.005, 0), ("b", 128, 0, 1),
                                    ("c", 8, 0, 0), ("c", 32, 0.009, 0), ("c", 128, 0.009, 0),
                                    ("d", 8, 0, 3), ("d", 32, 0, 3), ("d", 128, 0, 3)]:
        for seed in range(3):
            state = "diverged" if seed < diverged else "ok"
            rows.append({"variant": rule, "batch_size": b, "seed": seed, "state": state,
                         "test_acc": 0.9 - drop + (seed - 1) / 100 if state == "ok" else 0.1})
    return pd.DataFrame(rows)


def test_summarize_states_counts_outcomes_and_keeps_groups_that_all_diverged():
    table = recipes.summarize_states(_rows(), ["variant", "batch_size"], ["test_acc"])
    b128 = table[(table["variant"] == "b") & (table["batch_size"] == 128)].iloc[0]
    assert (b128["n_runs"], b128["n_ok"], b128["n_diverged"], b128["n_other"], b128["n"]) == (3, 2, 1, 0, 2)
    assert b128["test_acc_mean"] == pytest.approx(0.905)          # the seeds that finished, not the diverged one
    d8 = table[(table["variant"] == "d") & (table["batch_size"] == 8)].iloc[0]
    assert d8["n"] == 0 and d8["n_diverged"] == 3 and math.isnan(d8["test_acc_mean"])
    none_ok = recipes.summarize_states(_rows().assign(state="diverged"), "variant", ["test_acc"])
    assert (none_ok["n"] == 0).all() and none_ok["test_acc_mean"].isna().all()


def test_breaking_batch_finds_the_first_drop_or_divergence():
    table = recipes.summarize_states(_rows(), ["variant", "batch_size"], ["test_acc"])
    verdict = recipes.breaking_batch(table, "test_acc", drop=0.01).set_index("variant")
    assert verdict.loc["a", "first_broken"] == 32 and verdict.loc["a", "largest_ok"] == 8
    assert verdict.loc["a", "broken"] == (32,) and "< baseline" in verdict.loc["a", "why"]
    assert verdict.loc["b", "first_broken"] == 128 and verdict.loc["b", "largest_ok"] == 32
    assert "1 of 3 seeds diverged" in verdict.loc["b", "why"]
    assert math.isnan(verdict.loc["c", "first_broken"]) and verdict.loc["c", "largest_ok"] == 128
    assert verdict.loc["d", "first_broken"] == 8 and math.isnan(verdict.loc["d", "largest_ok"])
    assert verdict.loc["a", "baseline"] == pytest.approx(0.9)
    looser = recipes.breaking_batch(table, "test_acc", drop=0.02).set_index("variant")
    assert math.isnan(looser.loc["a", "first_broken"])
    with pytest.raises(ConfigError, match="test_acc_mean"):
        recipes.breaking_batch(table.drop(columns="test_acc_mean"))


# ----------------------------------------------------------------------------- figures
def test_rule_vs_batch_draws_a_line_per_rule_and_marks_divergence():
    rows = _rows()
    table = recipes.summarize_states(rows, ["variant", "batch_size"], ["test_acc"])
    fig, ax = plt.subplots()
    assert rule_vs_batch(ax, rows, table, "test_acc", order=["c", "b", "a", "d"]) is ax
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["c", "b", "a", "diverged (one x per seed)"]   # d never finished: no line
    lines = {c.get_label(): c.lines[0] for c in ax.containers}   # errorbar: (data line, caps, bars)
    assert sorted(lines) == ["a", "b", "c"] and all(len(l.get_xdata()) == 3 for l in lines.values())
    a = lines["a"]
    assert a.get_ydata()[1] == pytest.approx(0.885) and a.get_xdata()[1] == pytest.approx(32, rel=0.1)
    crosses = {c.get_label(): len(c.get_offsets()) for c in ax.collections if c.get_label().startswith("_diverged")}
    assert crosses == {"_diverged b": 1, "_diverged d": 9}
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [8, 32, 128]
    plt.close(fig)


def test_variant_points_lists_variants_top_down_with_intervals():
    rows = _rows()
    rows = rows[rows["batch_size"] == 8]
    table = recipes.summarize_states(rows, "variant", ["test_acc"])
    fig, ax = plt.subplots()
    variant_points(ax, rows, table, "test_acc", order=["b", "a", "c"])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a", "c"]
    assert list(ax.get_yticks()) == [2, 1, 0]
    means = ax.get_lines()[0]
    assert list(means.get_ydata()) == [2, 1, 0] and means.get_xdata() == pytest.approx([0.9] * 3)
    plt.close(fig)


def test_distance_vs_steps_draws_means_and_fitted_lines_on_a_log_axis():
    hist = pd.DataFrame(_history("sb", 0, 2.0) + _history("sb", 1, 4.0) + _history("lb", 0, 0.5))
    fits = recipes.distance_fits(hist, t_min=2)
    fig, ax = plt.subplots()
    distance_vs_steps(ax, hist, fits, order=["sb", "lb"])
    assert ax.get_xscale() == "log"
    solid = [l for l in ax.get_lines() if l.get_linestyle() == "-"]
    dashed = [l for l in ax.get_lines() if l.get_linestyle() == "--"]
    assert [l.get_label().split()[0] for l in solid] == ["sb", "lb"] and len(dashed) == 2
    sb = solid[0]
    assert sb.get_xdata()[0] == 1 and sb.get_ydata()[-1] == pytest.approx(3.0 * math.log(100))  # mean of seeds
    assert dashed[0].get_ydata()[-1] == pytest.approx(3.0 * math.log(100))                     # mean fit
    assert "R$^2$ 1.000" in sb.get_label()
    plt.close(fig)
    fixed = variant_colors(["x", "lb", "sb"])          # one colour per variant across figures
    fig, ax = plt.subplots()
    distance_vs_steps(ax, hist, fits, order=["sb", "lb"], colors=fixed)
    solid = [l for l in ax.get_lines() if l.get_linestyle() == "-"]
    assert [l.get_color() for l in solid] == [fixed["sb"], fixed["lb"]]
    plt.close(fig)


def test_recipes_do_not_import_torch():
    code = ("import sys, bsresearch.recipes, bsresearch.plots.recipes; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- differences and tables
def test_welch_interval_matches_scipys_unequal_variance_t_test():
    from scipy import stats
    a, b = [0.91, 0.93, 0.95, 0.90], [0.80, 0.86, 0.83]
    d = recipes.welch_interval(a, b)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d.diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high))
    assert (d.n_a, d.n_b) == (4, 3)
    one = recipes.welch_interval([0.9], [0.8, float("nan"), 0.7])
    assert one.diff == pytest.approx(0.15) and math.isnan(one.low) and one.n_b == 2
    same = recipes.welch_interval([1.0, 1.0], [0.5, 0.5])
    assert (same.low, same.high) == (0.5, 0.5)


def test_versus_reference_and_versus_baseline_batch_use_finished_runs_only():
    rows = _rows()
    vs = recipes.versus_reference(rows[rows["batch_size"] == 32], "test_acc", {"variant": "c"})
    a = vs.set_index("variant").loc["a"]
    assert a["diff"] == pytest.approx(-0.006) and a["low"] < a["diff"] < a["high"] and a["n_reference"] == 3
    per_batch = recipes.versus_baseline_batch(rows, "test_acc", baseline_batch=8).set_index(["variant", "batch_size"])
    assert per_batch.loc[("a", 32), "diff"] == pytest.approx(-0.015)
    assert per_batch.loc[("a", 8), "diff"] == pytest.approx(0.0)
    assert per_batch.loc[("b", 128), "n"] == 2                     # the diverged seed is not a number
    assert ("d", 8) not in per_batch.index                         # nothing finished


def test_markdown_table_writes_mean_and_std_per_metric():
    table = recipes.summarize_states(_rows(), ["variant", "batch_size"], ["test_acc"])
    text = recipes.markdown_table(table, ["variant", "batch_size"], ["test_acc"], counts=("n", "n_diverged"))
    lines = text.splitlines()
    assert lines[0] == "| variant | batch_size | n | n_diverged | test_acc |"
    assert "| a | 32 | 3 | 0 | 0.885 ± 0.01 |" in lines
    assert "| d | 8 | 0 | 3 | - |" in lines


def test_ingredient_pairs_and_effects_on_a_factorial_design():
    names = ["sb", "lb", "lb_sqrt", "lb_ra", "lb_sqrt_ra", "lb_gbn_ra"]
    assert recipes.ingredient_pairs(names) == [("sqrt", "lb_sqrt", "lb"), ("ra", "lb_ra", "lb"),
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
    table = recipes.ingredient_effects(pd.DataFrame(rows), "test_acc", names)
    assert list(table["ingredient"]) == ["sqrt", "sqrt", "ra", "ra", "gbn"]
    for _, row in table.iterrows():
        assert row["diff"] == pytest.approx(effect[row["ingredient"]])
        assert row["low"] < row["diff"] < row["high"] and row["n"] == row["n_reference"] == 3


def test_versus_within_compares_rules_at_the_same_batch_size():
    table = recipes.versus_within(_rows(), "test_acc", within="batch_size", compare="variant", reference="c")
    table = table.set_index(["batch_size", "variant"])
    assert table.loc[(32, "a"), "diff"] == pytest.approx(-0.006)      # 0.885 - 0.891
    assert table.loc[(128, "a"), "diff"] == pytest.approx(0.009)
    assert table.loc[(128, "c"), "diff"] == pytest.approx(0.0) and table.loc[(128, "b"), "n"] == 2
    assert ("d" not in table.index.get_level_values("variant"))       # nothing finished
    empty = recipes.versus_within(_rows()[lambda r: r["variant"] == "d"], "test_acc", "batch_size", "variant", "c")
    assert empty.empty and list(empty.columns)[:2] == ["batch_size", "variant"]
