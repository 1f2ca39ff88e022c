"""The critical batch size by branching: CBS per seed and checkpoint, the pre-registered growth test and the
table beside B_simple, on made-up branch results with hand-computed answers."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bsresearch.config import ConfigError
from bsresearch.findings.lm_cbs import (
    EPS,
    branch_losses,
    cbs_by_checkpoint,
    cbs_by_tolerance,
    cbs_test,
    critical_batch_sizes,
    loss_ratios,
)
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.lm_cbs import cbs_vs_tokens, ratio_vs_k

CHECKPOINTS = (8192.0, 32768.0, 131072.0)
KS = (1, 2, 4, 8, 16)


def runs(keep_up, seeds=(0, 1, 2, 3, 4), b0=4, noise=None):
    """Branches whose loss is 2.0 up to keep_up(seed, checkpoint) (the largest k keeping up) and 2.1 beyond;
    measurement runs with B_simple noise(seed, checkpoint)."""
    rows = []
    for seed in seeds:
        for c in CHECKPOINTS:
            for k in KS:
                loss = 2.0 if k <= keep_up(seed, c) else 2.1
                rows.append({"batch_schedule": "tokens", "batch_at_tokens": (c,), "batch_sizes": (k * b0,),
                             "batch_size": b0, "budget_amount": c + 1e5, "seed": seed, "state": "ok",
                             "test_loss": loss, "noise_b_simple": np.nan})
            if noise:
                rows.append({"batch_schedule": "constant", "batch_at_tokens": (), "batch_sizes": (), "batch_size": b0,
                             "budget_amount": c, "seed": seed, "state": "ok", "test_loss": 2.0,
                             "noise_b_simple": noise(seed, c)})
    return pd.DataFrame(rows)


GROWS = {8192.0: 1, 32768.0: 4, 131072.0: 8}       # k* per checkpoint: CBS 4, 16, 32 at b0 = 4


def test_cbs_is_the_largest_batch_up_to_which_every_branch_keeps_up():
    table = critical_batch_sizes(branch_losses(runs(lambda s, c: GROWS[c])))
    assert list(table[table["seed"] == 0]["cbs"]) == [4, 16, 32]
    assert not table["censored"].any() and table["complete"].all()
    # a branch that misses the tolerance stops the count even when a larger one keeps up again
    data = runs(lambda s, c: 16)
    data.loc[(data["batch_sizes"] == (8,)) & (data["seed"] == 0) & (data["batch_at_tokens"] == (8192.0,)),
             "test_loss"] = 2.05
    table = critical_batch_sizes(branch_losses(data))
    assert table.loc[(table["seed"] == 0) & (table["checkpoint"] == 8192.0), "cbs"].item() == 4
    assert table.loc[(table["seed"] == 1) & (table["checkpoint"] == 8192.0), "censored"].item()   # all keep up


def test_a_diverged_branch_never_keeps_up():
    data = runs(lambda s, c: 16)
    data.loc[(data["batch_sizes"] == (32,)) & (data["seed"] == 0), "state"] = "diverged"
    branches = branch_losses(data)
    assert math.isinf(branches.loc[(branches["seed"] == 0) & (branches["k"] == 8), "loss"].iloc[0])
    table = critical_batch_sizes(branches)
    assert set(table.loc[table["seed"] == 0, "cbs"]) == {16}
    # a k = 1 branch that has not finished gives no ratios (not zeros): no CBS, and the test waits
    data.loc[(data["batch_sizes"] == (4,)) & (data["seed"] == 1), "state"] = "pending"
    branches = branch_losses(data)
    assert branches.loc[branches["seed"] == 1, "ratio"].isna().all()
    assert cbs_test(critical_batch_sizes(branches)).verdict == Verdict.NOT_TESTABLE


def test_growth_and_plateau_decide_the_verdict():
    # same CBS for every seed: D = log2 32 - log2 4 = 3, G = log2 32 - log2 16 = 1 (no spread: the value)
    test = cbs_test(critical_batch_sizes(branch_losses(runs(lambda s, c: GROWS[c]))))
    assert (test.d, test.d_low, test.d_high) == (3, 3, 3) and test.g == 1
    assert test.verdict == Verdict.PARTLY          # grows, but doubles over the last factor 4: no plateau
    plateau = {8192.0: 1, 32768.0: 8, 131072.0: 8}
    assert cbs_test(critical_batch_sizes(branch_losses(runs(lambda s, c: plateau[c])))).verdict == Verdict.REPRODUCED
    flat = cbs_test(critical_batch_sizes(branch_losses(runs(lambda s, c: 2))))
    assert flat.d == 0 and flat.verdict == Verdict.NOT_REPRODUCED
    # seeds differ: seed 2's CBS at the end is 8 (log2 3), so D per seed is 3, 3, 1, 3, 3: mean 2.6
    varied = cbs_test(critical_batch_sizes(branch_losses(
        runs(lambda s, c: (2 if s == 2 and c == 131072.0 else GROWS[c])))))
    half = 2.776445 * np.std([3, 3, 1, 3, 3], ddof=1) / math.sqrt(5)
    assert varied.d == pytest.approx(2.6) and varied.d_low == pytest.approx(2.6 - half)


def test_a_censored_last_checkpoint_or_a_missing_k1_is_not_testable():
    censored = cbs_test(critical_batch_sizes(branch_losses(runs(lambda s, c: 16 if c == 131072.0 else 1))))
    assert censored.verdict == Verdict.NOT_TESTABLE and "largest batch tried" in censored.problems[0]
    data = runs(lambda s, c: GROWS[c])
    no_k1 = data[~((data["batch_sizes"] == (4,)) & (data["seed"] == 1))]
    assert cbs_test(critical_batch_sizes(branch_losses(no_k1))).verdict == Verdict.NOT_TESTABLE
    with pytest.raises(ConfigError, match="at least 3 checkpoints"):
        cbs_test(critical_batch_sizes(branch_losses(data[data["batch_at_tokens"] != (8192.0,)])))
    with pytest.raises(ConfigError, match="no branch"):
        branch_losses(data.assign(batch_schedule="constant"))


def test_the_table_beside_b_simple_and_the_figures():
    data = runs(lambda s, c: GROWS[c], noise=lambda s, c: c / 1000 + s)
    cbs = critical_batch_sizes(branch_losses(data))
    table = cbs_by_checkpoint(cbs, data)
    assert list(table["cbs_gmean"]) == pytest.approx([4, 16, 32])
    assert list(table["b_simple_mean"]) == pytest.approx([c / 1000 + 2 for c in CHECKPOINTS])
    assert table["cbs_over_b_simple"].iloc[0] == pytest.approx(4 / 10.192)
    ratios = loss_ratios(branch_losses(data))
    assert ratios.loc[(ratios["checkpoint"] == 8192.0) & (ratios["k"] == 2), "ratio_mean"].item() == pytest.approx(1.05)
    fig, axes = plt.subplots(1, 2)
    cbs_vs_tokens(axes[0], table, cbs)
    ratio_vs_k(axes[1], ratios)
    assert len(axes[0].get_legend().get_texts()) == 3
    bars = [c for c in axes[1].containers if c.has_yerr]           # the interval the caption promises, per checkpoint
    assert len(bars) == ratios["checkpoint"].nunique()
    plt.close(fig)


def test_a_stalled_reference_still_writes_its_verdict_and_the_committed_report_states_it():
    """The committed lm_cbs_long tables (cbs_per_seed.csv, stall.csv) give long_cbs_test's not-testable verdict,
    and long_test_table writes it as a test.csv row even though D and G were never computed."""
    from pathlib import Path

    from bsresearch.findings import lm_cbs
    folder = Path(__file__).resolve().parents[1] / "reports" / "lm_cbs_long"
    test = lm_cbs.long_cbs_test(pd.read_csv(folder / "cbs_per_seed.csv"), pd.read_csv(folder / "stall.csv"))
    assert test.verdict == Verdict.NOT_TESTABLE and test.test is None and "524,288" in test.why
    row = lm_cbs.long_test_table(test)
    assert len(row) == 1 and row["verdict"].tolist() == [Verdict.NOT_TESTABLE] and math.isnan(row["estimate"][0])
    assert row["seeds"].tolist() == [5] and row["problems"][0] == test.why
    committed = pd.read_csv(folder / "test.csv")
    assert committed["verdict"].tolist() == ["not testable"] and committed["problems"][0] == test.why


def test_version_6_stalls_only_when_the_interval_is_below_the_floor():
    """A near-threshold call is not a stall under version 6: mean 1.92% with its interval reaching above 2% is live
    (version 5 called it stalled by the mean), a reference improving 1.0 +- 0.1% is stalled; a larger batch whose
    ratio's interval lies below 0.995 stalls the reference too."""
    from bsresearch.findings import lm_cbs
    seeds = range(50, 55)
    rows = [{"seed": s, "checkpoint": c, "improvement": imp + d * (i - 2), "min_ratio": ratio}
            for c, imp, d, ratio in ((1.0, 0.0192, 0.004, 1.004), (2.0, 0.010, 0.0005, 1.003),
                                     (3.0, 0.05, 0.001, 0.990), (4.0, 0.035, 0.001, 0.996))
            for i, s in enumerate(seeds)]
    table = lm_cbs.stall_intervals(pd.DataFrame(rows)).set_index("checkpoint")
    assert table["stalled"].tolist() == [False, True, True, False]
    assert table.loc[1.0, "improvement_low"] < 0.02 < table.loc[1.0, "improvement_high"]
    assert table.loc[1.0, "improvement"] == pytest.approx(0.0192)


def test_the_cbs_by_tolerance_holds_the_tests_cbs_at_eps_and_moves_with_the_tolerance():
    data = runs(lambda s, c: GROWS[c])
    losses = branch_losses(data)
    k = losses["k"].to_numpy(float)
    losses["ratio"] = np.where(k == 1, 1.0, 1.0 + 0.003 * np.log2(np.maximum(k, 1)))   # 1.003 at k = 2 ... 1.012 at 16
    table = cbs_by_tolerance(losses)
    assert sorted(table["eps"].unique()) == [0.005, EPS, 0.02]
    at_eps = table[table["eps"] == EPS].drop(columns="eps").reset_index(drop=True)
    pd.testing.assert_frame_equal(at_eps, cbs_by_checkpoint(critical_batch_sizes(losses)))
    # ratios 1.003, 1.006, 1.009, 1.012 at k = 2, 4, 8, 16 (b0 = 4): eps 0.005 keeps k <= 2, 0.01 k <= 8, 0.02 all
    assert table.groupby("eps")["cbs_gmean"].first().tolist() == pytest.approx([8, 32, 64])
    assert table.loc[table["eps"] == 0.02, "censored"].tolist() == [5, 5, 5]
