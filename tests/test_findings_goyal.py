"""Goyal et al.: where a scaling rule breaks, comparisons against the base batch, the figure; made-up tables."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pytest
from conftest import variant_rows

from bsresearch import stats
from bsresearch.config import ConfigError
from bsresearch.findings import goyal
from bsresearch.findings.goyal import rule_vs_batch


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
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["c", "b", "a", "diverged (one x per seed)"]   # d never finished: no line
    lines = {c.get_label(): c.lines[0] for c in ax.containers}   # errorbar: (data line, caps, bars)
    assert sorted(lines) == ["a", "b", "c"] and all(len(line.get_xdata()) == 3 for line in lines.values())
    a = lines["a"]
    assert a.get_ydata()[1] == pytest.approx(0.885) and a.get_xdata()[1] == pytest.approx(32, rel=0.1)
    crosses = {c.get_label(): len(c.get_offsets()) for c in ax.collections if c.get_label().startswith("_diverged")}
    assert crosses == {"_diverged b": 1, "_diverged d": 9}
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [8, 32, 128]
    plt.close(fig)
