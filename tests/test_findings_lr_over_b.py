"""lr/B at a common train loss (protocol v5): each verdict can occur, on made-up runs."""
import math

import pandas as pd
import pytest

from bsresearch.findings import lr_over_b
from bsresearch.findings.verdict import Verdict

LRS = (0.01, 0.02, 0.04, 0.08, 0.16)
RATIOS = (1 / 1600, 1 / 6400)
SEEDS = (40, 41, 42, 43, 44)


def runs(acc, reached=lambda r, lr: True, spread=0.001):
    rows = []
    for r in RATIOS:
        for lr in LRS:
            for i, seed in enumerate(SEEDS):
                rows.append({"lr": lr, "batch_size": int(round(lr / r)), "seed": seed, "state": "ok",
                             "reached": reached(r, lr), "test_acc": acc(r, lr) + spread * (i - 2)})
    return pd.DataFrame(rows)


def test_a_function_of_lr_over_b_alone_is_reproduced():
    test = lr_over_b.equivalence_test(runs(lambda r, lr: 0.9 + 100 * r))
    assert test.verdict == Verdict.REPRODUCED and (test.per_diagonal["span"] == 16).all()
    assert test.per_diagonal["stops_why"].tolist() == ["grid end", "grid end"]


def test_where_it_stops_being_one_is_the_first_lr_that_differs_or_stops_training():
    test = lr_over_b.equivalence_test(runs(lambda r, lr: 0.9 - (0.05 if r > 3e-4 and lr >= 0.08 else 0.0),
                                           reached=lambda r, lr: not (r < 3e-4 and lr == 0.16)))
    per = test.per_diagonal.set_index("lr_over_b")
    assert per.loc[1 / 6400, "stops_why"] == "stops" and per.loc[1 / 6400, "span"] == 8
    assert per.loc[1 / 1600, "stops_why"] == "differs" and per.loc[1 / 1600, "stops_at"] == 0.08
    assert test.verdict == Verdict.REPRODUCED      # both spans >= 4


def test_partly_and_not_reproduced():
    partly = lr_over_b.equivalence_test(runs(lambda r, lr: 0.9 - (0.05 if r > 3e-4 and lr >= 0.02 else 0.0)))
    assert partly.verdict == Verdict.PARTLY and partly.n_holding == 1
    none = lr_over_b.equivalence_test(runs(lambda r, lr: 0.9 - (0.05 if lr >= 0.02 else 0.0)))
    assert none.verdict == Verdict.NOT_REPRODUCED and none.n_holding == 0


def test_too_few_cells_at_the_target_is_not_testable_and_undecided_adds_seeds():
    few = lr_over_b.equivalence_test(runs(lambda r, lr: 0.9, reached=lambda r, lr: lr <= 0.02))
    assert few.verdict == Verdict.NOT_TESTABLE
    wide = lr_over_b.equivalence_test(runs(lambda r, lr: 0.9 - (0.008 if lr >= 0.02 else 0.0), spread=0.006))
    assert wide.extend_seeds and wide.per_diagonal["undecided_before_span"].all()


def test_the_secondary_tables_accuracy_with_t_intervals_steps_and_other_margins():
    made_up = runs(lambda r, lr: 0.9 + 100 * r, reached=lambda r, lr: lr < 0.16).assign(
        steps_to_target=lambda d: 1000 / d["lr"])
    accuracy = lr_over_b.accuracy_table(made_up)
    assert len(accuracy) == 2 * 4   # the cells at lr 0.16 reached nothing
    row = accuracy[(accuracy["lr"] == 0.01) & (accuracy["lr_over_b"] == 1 / 1600)].iloc[0]
    # five seeds at 0.9625 + 0.001 (i - 2): mean 0.9625, std 0.00158, t(4) = 2.776
    assert abs(row["mean"] - (0.9 + 100 / 1600)) < 1e-12
    assert abs((row["high"] - row["mean"]) - 2.776 * 0.001581 / 5 ** 0.5) < 1e-5
    steps = lr_over_b.steps_table(made_up)
    assert set(steps["mean_steps"]) == {1000 / lr for lr in (0.01, 0.02, 0.04, 0.08)}
    margins = lr_over_b.margin_table(made_up, (0.005, 0.01))
    assert sorted(set(margins["margin"])) == [0.005, 0.01] and len(margins) == 4


# ----------------------------------------------------------------------------- version 6: rho, with its interval
def noisy_runs(acc, noise=0.002, seeds=range(50, 55), ratios=(1 / 1600, 1 / 3200, 1 / 6400), reached=None):
    import numpy as np
    rng = np.random.default_rng(0)
    rows = []
    for seed in seeds:
        for r in ratios:
            for lr in LRS:
                rows.append({"lr": lr, "batch_size": int(round(lr / r)), "seed": seed, "state": "ok",
                             "reached": True if reached is None else reached(r, lr),
                             "test_acc": acc(r, lr) + rng.normal(0, noise)})
    return pd.DataFrame(rows)


def test_per_seed_slopes_are_each_seeds_own_least_squares_fit():
    import numpy as np
    data = noisy_runs(lambda r, lr: 0.9 + 0.02 * np.log2(r * 6400) + 0.003 * np.log2(lr / 0.01), noise=0.0)
    slopes = lr_over_b.per_seed_slopes(data)
    assert len(slopes) == 5 and (slopes["n_cells"] == 15).all()
    assert np.allclose(slopes["b_r"], 0.02) and np.allclose(slopes["b_lr"], 0.003)
    # with noise: each seed's slopes are numpy's own fit of that seed's 15 runs
    noisy = noisy_runs(lambda r, lr: 0.9 + 0.02 * np.log2(r * 6400), noise=0.01)
    one = noisy[noisy["seed"] == 52]
    x = np.column_stack([np.ones(15), np.log2(one["lr"]), np.log2(one["lr"] / one["batch_size"])])
    coef = np.linalg.lstsq(x, one["test_acc"].to_numpy(), rcond=None)[0]
    got = lr_over_b.per_seed_slopes(noisy).set_index("seed").loc[52]
    assert got["b_lr"] == pytest.approx(coef[1]) and got["b_r"] == pytest.approx(coef[2])


def test_fieller_interval_is_the_set_of_ratios_whose_difference_interval_holds_zero():
    """Oracle: scan rho and keep each one for which the t interval of a - rho b (stats.t_interval) contains 0."""
    import numpy as np

    from bsresearch.stats import t_interval
    rng = np.random.default_rng(3)
    b = 0.02 + rng.normal(0, 0.004, 6)
    a = 0.002 + rng.normal(0, 0.002, 6)
    rho, low, high = lr_over_b.fieller_interval(a, b)
    assert rho == pytest.approx(a.mean() / b.mean())
    grid = np.linspace(-1, 1, 20001)
    kept = [g for g in grid if (lambda t: t[2] <= 0 <= t[3])(t_interval(a - g * b))]
    assert low == pytest.approx(min(kept), abs=2e-4) and high == pytest.approx(max(kept), abs=2e-4)
    # a denominator not shown to differ from 0: the set is unbounded
    assert lr_over_b.fieller_interval(a, rng.normal(0, 0.01, 6))[1:] == (-math.inf, math.inf)


def test_each_verdict_of_the_ratio_test_can_occur():
    import numpy as np
    lr_b = lambda r: 0.02 * np.log2(r * 6400)   # noqa: E731  2 points per doubling of lr/B
    small = lr_over_b.ratio_test(noisy_runs(lambda r, lr: 0.9 + lr_b(r) + 0.001 * np.log2(lr / 0.01)))
    assert small.precondition and small.verdict == Verdict.REPRODUCED and abs(small.rho - 0.05) < 0.05
    large = lr_over_b.ratio_test(noisy_runs(lambda r, lr: 0.9 + lr_b(r) + 0.02 * np.log2(lr / 0.01)))
    assert large.verdict == Verdict.NOT_REPRODUCED and large.rho_low > 0.25
    straddle = lr_over_b.ratio_test(noisy_runs(lambda r, lr: 0.9 + lr_b(r) + 0.005 * np.log2(lr / 0.01),
                                               noise=0.02))
    assert straddle.verdict == Verdict.PARTLY and straddle.extend_seeds and straddle.rho_low < 0.25 < straddle.rho_high
    flat = lr_over_b.ratio_test(noisy_runs(lambda r, lr: 0.86 + 0.001 * np.log2(lr / 0.01)))
    assert flat.verdict == Verdict.NOT_TESTABLE and not flat.precondition and "precondition fails" in flat.why
    few = lr_over_b.ratio_test(noisy_runs(lambda r, lr: 0.9 + lr_b(r), reached=lambda r, lr: r > 5e-4))
    assert few.verdict == Verdict.NOT_TESTABLE and "1 diagonals" in few.why
    table = lr_over_b.ratio_table(small)
    assert table["verdict"].tolist() == ["reproduced"] and table["seeds"].tolist() == [5]


def test_the_verdict_is_written_beside_the_spans_and_the_committed_reports_state_theirs():
    test = lr_over_b.equivalence_test(runs(lambda r, lr: 0.9 + 100 * r))
    table = lr_over_b.test_table(test)
    assert table["verdict"].tolist() == ["reproduced"] * 2 and (table["span"] == 16).all()
    # the committed reports: their test.csv's verdict is the one its spans give (version 5, as reported)
    from pathlib import Path
    reports = Path(__file__).resolve().parents[1] / "reports"
    for name, expected in (("lr_over_b_mnist1d", "not reproduced"), ("lr_over_b_fashion", "reproduced")):
        committed = pd.read_csv(reports / name / "test.csv")
        assert str(lr_over_b.span_verdict(committed.drop(columns=["verdict", "why"], errors="ignore"), [])[0]) \
            == expected
        assert committed["verdict"].unique().tolist() == [expected]
