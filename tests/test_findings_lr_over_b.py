"""lr/B at a common train loss (protocol v5): each verdict can occur, on made-up runs."""
import pandas as pd

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
