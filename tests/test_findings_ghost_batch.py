"""Ghost batch size: the pre-registered Welch comparison, the per-size table and the slope, on made-up runs
with hand-computed answers."""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bsresearch.config import ConfigError
from bsresearch.findings.ghost_batch import best_ghost, by_ghost_size, compare_ghost, ghost_slope
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.ghost_batch import accuracy_vs_ghost

GHOSTS = (16, 32, 64, 128, 256)


def rows(acc32, acc_none, others=0.91):
    out = [{"variant": "g32", "ghost_batch_size": 32, "seed": s, "test_acc": a} for s, a in enumerate(acc32)]
    out += [{"variant": "none", "ghost_batch_size": np.nan, "seed": s, "test_acc": a} for s, a in enumerate(acc_none)]
    out += [{"variant": f"g{g}", "ghost_batch_size": g, "seed": s, "test_acc": others}
            for g in (16, 64) for s in range(len(acc32))]
    table = pd.DataFrame(out).assign(batch_size=1024, state="ok", train_loss=0.1, test_loss=0.2)
    return table


BASE = [0.88, 0.89, 0.90, 0.91, 0.92]


def test_welch_interval_and_verdicts_by_hand():
    # means 0.92 and 0.90; both variances 2.5e-4 over 5 seeds: se 0.01, nu 8, t(0.975, 8) = 2.306004
    test = compare_ghost(rows([a + 0.02 for a in BASE], BASE))
    assert test.diff == pytest.approx(0.02) and (test.low, test.high) == pytest.approx((-0.00306004, 0.04306004))
    assert test.verdict == Verdict.PARTLY and test.n_ghost == 5 and test.batch_size == 1024
    assert compare_ghost(rows([a + 0.05 for a in BASE], BASE)).verdict == Verdict.REPRODUCED
    worse = compare_ghost(rows([a - 0.02 for a in BASE], BASE))
    assert worse.high == pytest.approx(0.00306004) and worse.verdict == Verdict.NOT_REPRODUCED


def test_a_run_that_did_not_end_ok_makes_it_not_testable():
    table = rows([a + 0.05 for a in BASE], BASE)
    table.loc[0, "state"] = "diverged"
    test = compare_ghost(table)
    assert test.verdict == Verdict.NOT_TESTABLE and "diverged" in test.problems[0]


def test_the_table_marks_whole_batch_statistics_as_the_batch_size():
    table = by_ghost_size(rows([a + 0.02 for a in BASE], BASE))
    assert list(table["ghost"]) == [16, 32, 64, 1024]
    none = table[table["ghost"] == 1024].iloc[0]
    assert none["test_acc_mean"] == pytest.approx(0.90) and none["vs_none"] == pytest.approx(0.0)
    assert table.loc[table["ghost"] == 32, "vs_none_low"].iloc[0] == pytest.approx(-0.00306004)
    assert np.allclose(table["gap_loss_mean"], 0.1)
    assert best_ghost(table)["ghost"] == 32                     # 0.92 > 0.91, and 1024 is not a candidate
    fig, ax = plt.subplots()
    accuracy_vs_ghost(ax, rows(BASE, BASE), table, "gap_loss")
    assert ax.get_xticklabels()[-1].get_text() == "1024\n(none)"
    plt.close(fig)


def test_slope_per_doubling_with_a_t_interval_over_seeds():
    # seed s: accuracy 0.8 + (0.01 + 0.001 s) log2(g): slopes 0.010 ... 0.014, mean 0.012,
    # std 0.001 sqrt(2.5), half-width t(0.975, 4) std / sqrt(5) = 2.776445 x 0.00158114 / 2.236068
    out = [{"ghost_batch_size": g, "seed": s, "test_acc": 0.8 + (0.01 + 0.001 * s) * np.log2(g)}
           for g in GHOSTS for s in range(5)]
    out += [{"ghost_batch_size": np.nan, "seed": s, "test_acc": 0.5} for s in range(5)]   # not in the slope
    slope = ghost_slope(pd.DataFrame(out).assign(batch_size=1024, state="ok"))
    assert slope.slope == pytest.approx(0.012) and slope.n_seeds == 5
    assert slope.high - slope.slope == pytest.approx(2.776445 * 0.00158114 / 2.236068, rel=1e-5)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ConfigError, match="one batch size"):
        compare_ghost(rows(BASE, BASE).assign(batch_size=[512] + [1024] * 19))
    with pytest.raises(ConfigError, match="smaller than the batch size"):
        compare_ghost(rows(BASE, BASE), ghost=1024)
