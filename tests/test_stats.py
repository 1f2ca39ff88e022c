"""bsresearch.stats: intervals and group summaries against scipy and hand-computed answers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from conftest import variant_rows

from bsresearch import stats


def test_summarize_states_counts_outcomes_and_keeps_groups_that_all_diverged():
    table = stats.summarize_states(variant_rows(), ["variant", "batch_size"], ["test_acc"])
    b128 = table[(table["variant"] == "b") & (table["batch_size"] == 128)].iloc[0]
    assert (b128["n_runs"], b128["n_ok"], b128["n_diverged"], b128["n_other"], b128["n"]) == (3, 2, 1, 0, 2)
    assert b128["test_acc_mean"] == pytest.approx(0.905)          # the seeds that finished, not the diverged one
    d8 = table[(table["variant"] == "d") & (table["batch_size"] == 8)].iloc[0]
    assert d8["n"] == 0 and d8["n_diverged"] == 3 and math.isnan(d8["test_acc_mean"])
    none_ok = stats.summarize_states(variant_rows().assign(state="diverged"), "variant", ["test_acc"])
    assert (none_ok["n"] == 0).all() and none_ok["test_acc_mean"].isna().all()


def test_welch_interval_matches_scipys_unequal_variance_t_test():
    a, b = [0.91, 0.93, 0.95, 0.90], [0.80, 0.86, 0.83]
    d = stats.welch_interval(a, b)
    ci = scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert d.diff == pytest.approx(np.mean(a) - np.mean(b))
    assert (d.low, d.high) == pytest.approx((ci.low, ci.high))
    assert (d.n_a, d.n_b) == (4, 3)
    one = stats.welch_interval([0.9], [0.8, float("nan"), 0.7])
    assert one.diff == pytest.approx(0.15) and math.isnan(one.low) and one.n_b == 2
    same = stats.welch_interval([1.0, 1.0], [0.5, 0.5])
    assert (same.low, same.high) == (0.5, 0.5)


def test_markdown_table_writes_mean_and_std_per_metric():
    table = stats.summarize_states(variant_rows(), ["variant", "batch_size"], ["test_acc"])
    text = stats.markdown_table(table, ["variant", "batch_size"], ["test_acc"], counts=("n", "n_diverged"))
    lines = text.splitlines()
    assert lines[0] == "| variant | batch_size | n | n_diverged | test_acc |"
    assert "| a | 32 | 3 | 0 | 0.885 ± 0.01 |" in lines
    assert "| d | 8 | 0 | 3 | - |" in lines


def test_versus_within_compares_rules_at_the_same_batch_size():
    table = stats.versus_within(variant_rows(), "test_acc", within="batch_size", compare="variant", reference="c")
    table = table.set_index(["batch_size", "variant"])
    assert table.loc[(32, "a"), "diff"] == pytest.approx(-0.006)      # 0.885 - 0.891
    assert table.loc[(128, "a"), "diff"] == pytest.approx(0.009)
    assert table.loc[(128, "c"), "diff"] == pytest.approx(0.0) and table.loc[(128, "b"), "n"] == 2
    assert ("d" not in table.index.get_level_values("variant"))       # nothing finished
    empty = stats.versus_within(variant_rows()[lambda r: r["variant"] == "d"], "test_acc", "batch_size", "variant", "c")
    assert empty.empty and list(empty.columns)[:2] == ["batch_size", "variant"]


def test_t_interval_matches_scipy_and_drops_missing_values():
    values = [0.80, 0.84, 0.79, float("nan"), 0.83, None]
    mean, std, low, high = stats.t_interval(values, 0.9)
    clean = np.array([0.80, 0.84, 0.79, 0.83])
    expected = scipy.stats.t.interval(0.9, len(clean) - 1, loc=clean.mean(), scale=scipy.stats.sem(clean))
    assert mean == pytest.approx(clean.mean()) and std == pytest.approx(clean.std(ddof=1))
    assert (low, high) == pytest.approx(expected)
    single = stats.t_interval([0.5])
    assert single[0] == 0.5 and all(math.isnan(v) for v in single[1:])
    assert math.isnan(stats.t_interval([])[0])


def test_frame_markdown_writes_every_cell_with_nan_as_a_dash():
    import pandas as pd
    text = stats.frame_markdown(pd.DataFrame({"B": [8, 32], "slope": [-0.123456, math.nan], "ok": [True, False]}), 3)
    assert text == "| B | slope | ok |\n|---|---|---|\n| 8 | -0.123 | True |\n| 32 | - | False |\n"
