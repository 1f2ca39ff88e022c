"""Small batches and Adam's beta2: settings read from configs, the lr selection with its edge rule, the
seeds spec's overrides, the pre-registered paired test and the secondary comparisons, on made-up runs with
hand-computed answers."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import yaml

from bsresearch.findings.lm_small_batch import (
    by_batch,
    per_seed,
    secondary,
    seeds_overrides,
    select_lr,
    settings,
    small_batch_test,
)
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.lm_small_batch import loss_vs_batch, spread_vs_batch

BATCHES = (1, 4, 256)
SEEDS = (3, 4, 5, 6, 7)


def run(setting, batch, seed, loss, lr=1e-3, state="ok", micro=None):
    optimizer = "sgd" if setting == "sgd" else "adam"
    return {"optimizer": optimizer, "beta2_scaling": "half_life" if setting == "adam_half_life" else "none",
            "batch_size": batch, "micro_batch_size": micro, "seed": seed, "lr": lr, "state": state, "test_loss": loss}


def confirm(fixed_at_1=2.10, half_at_1=2.00, half_at_256=2.05, noise=(0.0, 0.01, -0.01, 0.02, -0.02)):
    rows = []
    for seed, e in zip(SEEDS, noise):
        rows += [run("adam_fixed", 1, seed, fixed_at_1 + e), run("adam_half_life", 1, seed, half_at_1 + e),
                 run("adam_fixed", 256, seed, half_at_256 + e), run("adam_half_life", 256, seed, half_at_256 + e),
                 run("sgd", 1, seed, 2.05 + e), run("sgd", 256, seed, 2.40 + e),
                 run("adam_half_life", 4, seed, 2.01 + e),
                 run("adam_half_life", 256, seed, half_at_256 + e + 1e-6, micro=4)]
    return pd.DataFrame(rows)


def test_settings_are_read_from_the_configs():
    data = pd.DataFrame([run("adam_fixed", 4, 0, 2.0), run("adam_half_life", 4, 0, 2.0), run("sgd", 4, 0, 2.0),
                         run("adam_half_life", 256, 0, 2.0, micro=4), run("adam_half_life", 4, 0, 2.0, micro=4)])
    assert list(settings(data)) == ["adam_fixed", "adam_half_life", "sgd", "adam_half_life_accumulated",
                                    "adam_half_life"]   # micro = batch: no accumulation


def test_lr_selection_the_edge_rule_and_the_overrides():
    rows = []
    for seed in (1, 2):
        for lr, loss in ((1e-4, 2.3), (3e-4, 2.1), (1e-3, 2.2)):      # interior best: 3e-4
            rows.append(run("adam_half_life", 1, seed, loss, lr))
        for lr, loss in ((1e-3, 2.3), (3e-3, 2.2), (1e-2, 2.1)):      # best at the largest lr: extend
            rows.append(run("adam_fixed", 256, seed, loss, lr))
    rows.append(run("sgd", 4, 1, 2.0, 0.1))
    rows.append(run("sgd", 4, 2, math.nan, 0.1, state="diverged"))    # counts as the worst
    rows += [run("sgd", 4, s, 2.5, 0.03) for s in (1, 2)]
    selection = select_lr(pd.DataFrame(rows))
    best = selection.set_index(["setting", "batch_size"])
    assert best.loc[("adam_half_life", 1), "best_lr"] == 3e-4 and best.loc[("adam_half_life", 1), "edge"] == ""
    assert best.loc[("adam_fixed", 256), "edge"] == "largest"
    assert best.loc[("sgd", 4), "best_lr"] == 0.03     # lr 0.1 has a diverged seed: its mean is +inf
    assert best.loc[("adam_half_life", 1), "spread"] == pytest.approx(0.2)
    parsed = yaml.safe_load(seeds_overrides(selection))["overrides"]
    assert {"where": {"variant": "adam_half_life", "batch_size": 1}, "set": {"lr": 3e-4}} in parsed


def test_the_paired_test_by_hand_and_its_verdicts():
    test = small_batch_test(confirm())
    # every paired difference is the same over seeds (the noise cancels): intervals of zero width
    assert test.d_beta2.diff == pytest.approx(0.10) and test.d_beta2.low == pytest.approx(0.10)
    assert test.d_small.diff == pytest.approx(-0.05) and test.reference == pytest.approx(2.05)
    assert (test.small, test.large, test.verdict) == (1, 256, Verdict.REPRODUCED)
    assert small_batch_test(confirm(fixed_at_1=2.00)).verdict == Verdict.PARTLY     # beta2 makes no difference
    assert small_batch_test(confirm(half_at_1=2.10, fixed_at_1=2.10)).verdict == Verdict.NOT_REPRODUCED
    # 2.07 vs 2.05: 0.02 worse, more than 1% of 2.05 (0.0205)? no: 0.02 <= 0.0205, so still no worse
    assert small_batch_test(confirm(fixed_at_1=2.2, half_at_1=2.07)).verdict == Verdict.REPRODUCED
    assert small_batch_test(confirm(fixed_at_1=2.2, half_at_1=2.08)).verdict == Verdict.PARTLY


def test_paired_intervals_over_seeds():
    noise_fixed = (0.0, 0.02, -0.02, 0.04, -0.04)
    data = confirm()
    data.loc[data["optimizer"].eq("adam") & data["beta2_scaling"].eq("none") & data["batch_size"].eq(1),
             "test_loss"] = [2.10 + e for e in noise_fixed]
    test = small_batch_test(data)
    diffs = np.array([0.10 + a - b for a, b in zip(noise_fixed, (0.0, 0.01, -0.01, 0.02, -0.02))])
    half = 2.776445 * diffs.std(ddof=1) / math.sqrt(5)
    assert (test.d_beta2.low, test.d_beta2.high) == pytest.approx((0.10 - half, 0.10 + half))


def test_a_run_that_did_not_end_ok_makes_it_not_testable():
    data = confirm()
    data.loc[0, "state"] = "failed"
    test = small_batch_test(data)
    assert test.verdict == Verdict.NOT_TESTABLE and "failed" in test.problems[0]


def test_secondary_comparisons_and_figures():
    more = secondary(confirm()).set_index("comparison")
    assert more.loc["SGD - Adam (half-life), batch 1", "diff"] == pytest.approx(0.05)
    assert more.loc["SGD - Adam (half-life), batch 256", "diff"] == pytest.approx(0.35)
    assert more.loc["SGD gap at batch 1 minus at batch 256", "diff"] == pytest.approx(-0.30)
    assert more.loc["accumulated 256 (micro 4) - true batch 256", "diff"] == pytest.approx(1e-6)
    assert more.loc["accumulated 256 (micro 4) - true batch 4", "diff"] == pytest.approx(0.04 + 1e-6)
    table = by_batch(confirm())
    assert set(table["setting"]) == {"adam_fixed", "adam_half_life", "sgd", "adam_half_life_accumulated"}
    fig, axes = plt.subplots(1, 2)
    loss_vs_batch(axes[0], table)
    selection = select_lr(confirm().assign(seed=1))
    spread_vs_batch(axes[1], selection)
    assert len(axes[0].get_legend().get_texts()) == 4
    plt.close(fig)


def test_per_seed_table_recomputes_every_paired_statistic_of_test_and_secondary():
    """per_seed.csv holds, per comparison and seed, both cells' losses and their difference: the means and
    paired t intervals of test.csv and secondary.csv follow from it alone (a synthetic table, noise per cell)."""
    from bsresearch.stats import t_interval
    rng = np.random.default_rng(3)
    data = confirm()
    data["test_loss"] = data["test_loss"] + rng.normal(0, 0.02, len(data))
    data.loc[(data["seed"] == 7) & (data["optimizer"] == "sgd") & (data["batch_size"] == 1), "state"] = "diverged"
    table = per_seed(data)
    assert list(table.columns) == ["comparison", "seed", "setting_a", "batch_a", "a", "setting_b", "batch_b", "b",
                                   "diff"]
    assert np.allclose(table["diff"], table["a"] - table["b"])
    test = small_batch_test(data)
    more = secondary(data).set_index("comparison")
    expected = {"d_beta2 = L(adam fixed, B=1) - L(adam half-life, B=1)": test.d_beta2,
                "d_small = L(adam half-life, B=1) - L(adam half-life, B=256)": test.d_small}
    for name, group in table.groupby("comparison"):
        mean, _, low, high = t_interval(group["diff"])
        if name in expected:
            p = expected[name]
            assert (mean, low, high, len(group)) == pytest.approx((p.diff, p.low, p.high, p.n))
        else:
            row = more.loc[name]
            assert (mean, low, high, len(group)) == pytest.approx((row["diff"], row["low"], row["high"], row["n"]))
    assert set(table["comparison"]) == set(expected) | (set(more.index) - {"SGD gap at batch 1 minus at batch 256"})
    sgd_small = table[table["comparison"] == "SGD - Adam (half-life), batch 1"]
    assert 7 not in set(sgd_small["seed"]) and len(sgd_small) == 4          # a run that did not end ok: out
