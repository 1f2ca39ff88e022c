"""The language-model tests of protocol v5: the stall criterion of the branching test, beta2 at every batch
size, SGD at its held-out best lr; each verdict on made-up runs."""
import math

import numpy as np
import pandas as pd
import pytest

from bsresearch.findings import lm_cbs, lm_small_batch, power
from bsresearch.findings.verdict import Verdict

CHECKPOINTS = (131072.0, 524288.0, 2097152.0, 8388608.0)
KS = (1, 4, 16, 64)


def branching(keep_up, at_loss, end_loss, beaten=1.0, seeds=(40, 41, 42, 43, 44), b0=8):
    rows = []
    for seed in seeds:
        for c in CHECKPOINTS:
            for k in KS:
                loss = end_loss(c) * (1.0 if k <= keep_up(c) else 1.05) * (beaten if k == 4 else 1.0)
                rows.append({"batch_schedule": "tokens", "batch_at_tokens": (c,), "batch_sizes": (k * b0,),
                             "batch_size": b0, "budget_amount": 1.5 * c, "seed": seed, "state": "ok",
                             "test_loss": loss})
            rows.append({"batch_schedule": "constant", "batch_at_tokens": (), "batch_sizes": (), "batch_size": b0,
                         "budget_amount": c, "seed": seed, "state": "ok", "test_loss": at_loss(c)})
    return pd.DataFrame(rows)


GROWS = {131072.0: 1, 524288.0: 4, 2097152.0: 16, 8388608.0: 16}


def analyse(runs):
    branches = lm_cbs.branch_losses(runs)
    stalls = lm_cbs.stall_table(branches, lm_cbs.checkpoint_losses(runs))
    return lm_cbs.long_cbs_test(lm_cbs.critical_batch_sizes(branches), stalls)


def test_a_reference_still_improving_keeps_every_checkpoint():
    test = analyse(branching(GROWS.get, lambda c: 3.0, lambda c: 2.8))
    assert not test.stalls["stalled"].any() and test.last_used == CHECKPOINTS[-1]
    assert test.verdict == Verdict.REPRODUCED        # growth 8 -> 128 then a plateau 128 -> 128


def test_a_stalled_last_checkpoint_is_dropped_and_the_test_made_on_the_others():
    end = {c: 2.8 for c in CHECKPOINTS[:-1]} | {CHECKPOINTS[-1]: 2.99}    # improves by < 2% at the last
    test = analyse(branching(GROWS.get, lambda c: 3.0, end.get))
    assert test.stalls.set_index("checkpoint")["stalled"].tolist() == [False, False, False, True]
    assert test.last_used == CHECKPOINTS[-2] and test.verdict == Verdict.PARTLY     # 32 -> 128: no plateau yet


def test_a_larger_batch_beating_the_reference_is_a_stall_and_too_few_checkpoints_is_not_testable():
    test = analyse(branching(GROWS.get, lambda c: 3.0, lambda c: 2.8, beaten=0.99))
    assert test.stalls["stalled"].sum() == 3 and test.verdict == Verdict.NOT_TESTABLE and test.test is None


def small_batch_runs(fixed_minus_half, seeds=(40, 41, 42, 43, 44), sgd=None, steps=2 ** 14):
    rows = []
    for b, d in fixed_minus_half.items():
        for i, seed in enumerate(seeds):
            e = 0.002 * (i - 2)
            base = {"batch_size": b, "seed": seed, "state": "ok", "micro_batch_size": np.nan,
                    "total_steps": steps // b, "lr": 1e-3}
            rows.append({**base, "optimizer": "adam", "beta2_scaling": "none", "test_loss": 2.0 + d + e})
            rows.append({**base, "optimizer": "adam", "beta2_scaling": "half_life", "test_loss": 2.0 + e})
    for lr, loss in (sgd or {}).items():
        for i, seed in enumerate(seeds):
            rows.append({"batch_size": 1, "seed": seed, "state": "ok", "micro_batch_size": np.nan,
                         "total_steps": steps, "lr": lr, "optimizer": "sgd", "beta2_scaling": "none",
                         "test_loss": loss + 0.002 * (i - 2)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("d, verdict", [
    ({1: 0.06, 4: 0.02, 16: 0.0}, Verdict.REPRODUCED),
    ({1: 0.06, 4: -0.02, 16: 0.0}, Verdict.PARTLY),
    ({1: 0.0, 4: 0.02, 16: 0.0}, Verdict.NOT_REPRODUCED),
])
def test_beta2_at_every_batch_size(d, verdict):
    assert lm_small_batch.beta2_by_batch_test(small_batch_runs(d)).verdict == verdict


def test_too_few_updates_is_not_testable():
    test = lm_small_batch.beta2_by_batch_test(small_batch_runs({1: 0.06, 64: 0.0}, steps=2 ** 15))
    assert test.verdict == Verdict.NOT_TESTABLE and "64" in test.why


def test_sgd_at_its_held_out_best_lr():
    near = lm_small_batch.sgd_test(small_batch_runs({1: 0.06}, sgd={0.3: 2.1, 1.0: 2.01, 3.0: 2.2}))
    assert near.verdict == Verdict.REPRODUCED and near.held_out_lrs == (1.0,) * 5
    far = lm_small_batch.sgd_test(small_batch_runs({1: 0.06}, sgd={0.3: 2.6, 1.0: 2.5, 3.0: 2.7}))
    assert far.verdict == Verdict.NOT_REPRODUCED
    edge = lm_small_batch.sgd_test(small_batch_runs({1: 0.06}, sgd={0.3: 2.6, 1.0: 2.5, 3.0: 2.4}))
    assert edge.verdict == Verdict.NOT_TESTABLE and edge.edge == "largest"


def lr_grid_runs(d, losses, b=64, seeds=(40, 41, 42, 43, 44)):
    """The GPU spec's cells: both beta2 rules at one batch size on an lr grid; `losses` per lr for the half-life
    rule, the fixed rule `d` worse at every lr."""
    rows = []
    for lr, loss in losses.items():
        for i, seed in enumerate(seeds):
            base = {"batch_size": b, "seed": seed, "state": "ok", "micro_batch_size": np.nan, "total_steps": 1024,
                    "lr": lr, "optimizer": "adam"}
            e = 0.002 * (i - 2)
            rows.append({**base, "beta2_scaling": "none", "test_loss": loss + d + e})
            rows.append({**base, "beta2_scaling": "half_life", "test_loss": loss + e})
    return pd.DataFrame(rows)


def test_a_cell_on_an_lr_grid_takes_each_seed_at_its_held_out_lr():
    grid = lr_grid_runs(-0.05, {1e-4: 2.6, 3e-4: 2.5, 1e-3: 2.55, 3e-3: float("nan")})
    test = lm_small_batch.beta2_by_batch_test(pd.concat([small_batch_runs({1: 0.06, 4: 0.02}), grid]))
    row = test.per_batch.set_index("batch_size").loc[64]
    assert row["n"] == 5 and row["lr_half_life"] == " ".join(["0.0003"] * 5)
    assert row["diff"] == pytest.approx(-0.05) and test.verdict == Verdict.PARTLY   # the fixed beta2 wins at 64
    edge = lm_small_batch.beta2_by_batch_test(lr_grid_runs(0.0, {1e-4: 2.4, 3e-4: 2.5, 1e-3: 2.55}))
    assert edge.verdict == Verdict.NOT_TESTABLE and "smallest" in edge.why


def test_held_out_lr_is_never_chosen_on_the_seed_itself():
    cell = pd.DataFrame({"seed": [1, 1, 2, 2, 3, 3], "lr": [0.1, 1.0] * 3, "loss": [1.0, 2.2, 2.0, 1.0, 2.0, 1.2]})
    chosen, picks = lm_small_batch.held_out(cell)
    assert picks == (1.0, 0.1, 0.1)          # seed 1 alone prefers 0.1; seeds 2 and 3 choose 1.0 for it
    assert chosen["loss"].tolist() == [2.2, 2.0, 2.0]


def test_the_long_tests_table_is_what_the_deciding_figure_reads(tmp_path):
    from bsresearch.plots import deciding
    test = analyse(branching(GROWS.get, lambda c: 3.0, lambda c: 2.8))
    lm_cbs.test_table(test.test, test.verdict, test.problems).to_csv(tmp_path / "test.csv", index=False)
    d, g = deciding.lm_cbs(tmp_path)
    assert (d.estimate, d.low, d.high) == (round(test.test.d, 3), round(test.test.d_low, 3), round(test.test.d_high, 3))
    assert (g.estimate, g.band) == (round(test.test.g, 3), (-deciding.INF, 1.0))
    assert pd.read_csv(tmp_path / "test.csv")["verdict"][0] == test.verdict == Verdict.REPRODUCED
    assert [p.name for p in deciding.redraw("lm_cbs", tmp_path)][0] == "deciding.png"


def test_stall_per_seed_holds_what_the_stall_table_averages_and_the_figure_draws_both():
    import matplotlib.pyplot as plt

    from bsresearch.plots.findings.lm_cbs import stall_vs_tokens
    runs = branching(GROWS.get, lambda c: 3.0, lambda c: 2.8)
    branches, at = lm_cbs.branch_losses(runs), lm_cbs.checkpoint_losses(runs)
    seeds, table = lm_cbs.stall_per_seed(branches, at), lm_cbs.stall_table(branches, at)
    means = seeds.groupby("checkpoint")[["improvement", "min_ratio"]].mean()
    assert list(means["improvement"]) == pytest.approx(list(table["improvement"]))
    assert list(means["min_ratio"]) == pytest.approx(list(table["min_ratio"]))
    fig, axes = plt.subplots(1, 2)
    stall_vs_tokens((axes[0], axes[1]), seeds, table)
    assert len(axes[0].collections) == 1 and axes[0].lines[-1].get_ydata()[0] == lm_cbs.STALL_IMPROVEMENT
    plt.close(fig)


def test_the_stall_figure_of_a_partial_sweep_draws_what_is_measured_and_says_what_is_not():
    import matplotlib.pyplot as plt

    from bsresearch.plots.findings.lm_cbs import stall_vs_tokens
    runs = branching(GROWS.get, lambda c: 3.0, lambda c: 2.8)
    branches, at = lm_cbs.branch_losses(runs), lm_cbs.checkpoint_losses(runs)
    seeds, table = lm_cbs.stall_per_seed(branches, at), lm_cbs.stall_table(branches, at)
    seeds["improvement"], table["improvement"] = np.nan, np.nan       # no reference loss at any checkpoint yet
    fig, axes = plt.subplots(1, 2)
    stall_vs_tokens((axes[0], axes[1]), seeds, table)
    fig.canvas.draw()                                                 # a log axis over no data raised here
    assert [t.get_text() for t in axes[0].texts] == ["not measured yet"] and not axes[0].collections
    assert len(axes[1].collections) == 1 and not axes[1].texts
    plt.close(fig)


def test_a_long_test_with_too_few_checkpoints_and_none_stalled_says_so_not_that_one_stalled():
    runs = branching(GROWS.get, lambda c: 3.0, lambda c: 2.8)
    runs = runs[runs["budget_amount"] >= CHECKPOINTS[2]]              # a partial sweep: the last two checkpoints
    test = analyse(runs)
    assert test.verdict == Verdict.NOT_TESTABLE and not test.stalls["stalled"].any()
    assert test.why == "2 checkpoint(s) have branch losses, fewer than the 3 the test needs"


def test_a_not_testable_long_test_names_the_stalled_checkpoint_not_those_dropped_after_it():
    end = {c: 2.8 for c in CHECKPOINTS} | {CHECKPOINTS[1]: 2.99}      # only the second checkpoint stalls
    test = analyse(branching(GROWS.get, lambda c: 3.0, end.get))
    assert test.verdict == Verdict.NOT_TESTABLE and test.stalls["stalled"].sum() == 1
    assert "stalled at 524,288 tokens" in test.why and "1 of 4" in test.why


def test_the_lr_grid_table_is_the_sgd_tests_grid_cell_by_cell():
    runs = small_batch_runs({1: 0.06}, sgd={0.3: 2.6, 1.0: 2.5, 3.0: 2.7})
    runs.loc[(runs["optimizer"] == "sgd") & (runs["lr"] == 3.0) & (runs["seed"] == 44), "state"] = "diverged"
    table = lm_small_batch.lr_grid_table(runs)
    assert table["lr"].tolist() == [0.3, 1.0, 3.0] and table["runs"].tolist() == [5, 5, 5]
    assert table["not_ok"].tolist() == [0, 0, 1] and table["best"].tolist() == [False, True, False]
    assert table["held_out_by"].tolist() == ["", "40, 41, 42, 43, 44", ""]
    middle = table.iloc[1]
    # five seeds at 2.5 + 0.002 (i - 2): mean 2.5, t(4) x std / sqrt(5)
    assert middle["mean"] == pytest.approx(2.5) and middle["high"] - middle["mean"] == pytest.approx(
        2.776445 * 0.0031623 / 5 ** 0.5, rel=1e-4)
    test = lm_small_batch.sgd_test(runs)
    assert test.best_lr == 1.0 and set(test.held_out_lrs) == {1.0}


def earlier_per_seed(d_at_1=0.07, d_at_4=-0.05):
    """Version 5's committed per_seed.csv in miniature: d_beta2 rows at batch 1 and 4, and an SGD row."""
    rows = [{"batch_size": b, "seed": 40 + i, "a": 2.0 + d + 0.003 * (i - 2), "b": 2.0, "statistic": "d_beta2"}
            for b, d in ((1, d_at_1), (4, d_at_4)) for i in range(5)]
    rows.append({"batch_size": 1, "seed": 40, "a": 2.4, "b": 2.0, "statistic": "sgd_gap"})
    return pd.DataFrame(rows).assign(diff=lambda t: t["a"] - t["b"])


@pytest.mark.parametrize("d4, d16, verdict, readings", [
    (0.02, 0.03, Verdict.REPRODUCED, ["the half-life rule is better"] * 3),
    (-0.03, 0.0, Verdict.PARTLY, ["the half-life rule is better", "the fixed beta2 is better", "no difference shown"]),
])
def test_version_6_rows_replace_version_5_s_at_4_and_16_and_batch_1_is_kept(d4, d16, verdict, readings):
    seeds = tuple(range(50, 66))
    runs = pd.concat([lr_grid_runs(d4, {3e-4: 2.6, 1e-3: 2.5, 3e-3: 2.55, 1e-2: 2.7}, b=4, seeds=seeds),
                      lr_grid_runs(d16, {3e-4: 2.6, 1e-3: 2.5, 3e-3: 2.55, 1e-2: 2.7}, b=16, seeds=seeds)])
    test = lm_small_batch.beta2_v6_test(runs, earlier_per_seed(d_at_4=-0.05))
    per = test.per_batch.set_index("batch_size")
    assert list(per.index) == [1, 4, 16] and list(per["source"]) == ["version 5", "version 6", "version 6"]
    assert per.loc[1, "diff"] == pytest.approx(0.07) and per.loc[1, "n"] == 5      # the SGD row is not a d_beta2 row
    assert per.loc[4, "diff"] == pytest.approx(d4) and per.loc[4, "n"] == 16        # v5's -0.05 at 4 replaced
    assert test.rows.per_batch["lr_half_life"].tolist() == [" ".join(["0.001"] * 16)] * 2
    assert test.verdict == verdict and list(per["reading"]) == readings


def test_version_6_on_its_grid_s_edge_is_not_testable():
    seeds = tuple(range(50, 56))
    runs = pd.concat([lr_grid_runs(0.02, {3e-4: 2.4, 1e-3: 2.5, 3e-3: 2.55}, b=4, seeds=seeds),
                      lr_grid_runs(0.02, {3e-4: 2.6, 1e-3: 2.5, 3e-3: 2.55}, b=16, seeds=seeds)])
    test = lm_small_batch.beta2_v6_test(runs, earlier_per_seed())
    assert test.verdict == Verdict.NOT_TESTABLE and "batch 4" in test.why and "smallest" in test.why


def test_a_batch_size_its_held_out_rule_empties_is_not_testable_and_has_no_power_statement():
    # batch 4 with 16 seeds, batch 16 with 1 (a partial sweep): batch 16's one seed has no other seed to choose its
    # lr on, so it has 0 paired seeds and the test is not testable (it once dropped the batch size and judged the
    # rest); the detectable effect at v5's per-seed sd, as power.detectable_effect computes it, at batch 4 only
    grid = {3e-4: 2.6, 1e-3: 2.5, 3e-3: 2.55, 1e-2: 2.7}
    runs = pd.concat([lr_grid_runs(0.02, grid, b=4, seeds=tuple(range(50, 66))),
                      lr_grid_runs(0.02, grid, b=16, seeds=(50,))])
    earlier = earlier_per_seed()
    test = lm_small_batch.beta2_v6_test(runs, earlier)
    assert test.verdict == Verdict.NOT_TESTABLE and test.why == "batch 16: 0 paired seeds"
    table = lm_small_batch.detectable_by_batch(test, earlier).set_index("batch_size")
    sd4 = earlier[(earlier["statistic"] == "d_beta2") & (earlier["batch_size"] == 4)]["diff"].std()
    assert table.loc[4, "n"] == 16 and table.loc[4, "sd_v5"] == pytest.approx(sd4)
    assert table.loc[4, "detectable"] == pytest.approx(power.detectable_effect(16, sd4))
    assert 0 < table.loc[4, "detectable"] < 3 * sd4
    assert table.loc[16, "n"] == 0 and math.isnan(table.loc[16, "detectable"])
