"""B/N, B/B_crit or steps (protocol v5): each verdict of the break test and of the gap test can occur, on
made-up tables with known answers."""
import math

import numpy as np
import pandas as pd
import pytest

from bsresearch.findings import bn_budget
from bsresearch.findings.adam_vs_sgd import CriticalBatchRatio
from bsresearch.findings.verdict import Verdict
from bsresearch.measure.critical import fit_critical_batch

NS = (10000, 20000, 40000)
GRID = (250, 500, 1000, 2000, 4000)
SEEDS = (40, 41, 42, 43, 44)


def ratio(octaves, half=0.3):
    r = 2.0 ** octaves
    return CriticalBatchRatio(r, r * 2 ** -half, r * 2 ** half, 10.0, 40.0 * r, (30.0, 50.0), 40.0, (30.0, 50.0),
                              True, 2.0, Verdict.NOT_REPRODUCED, True)


def goyal_rows(breaks):
    """breaks[(n, arm)] = the smallest batch that fails at every lr (inf: none); the best lr is k = 1."""
    rows = []
    for n in NS:
        for i, seed in enumerate(SEEDS):
            rows.append({"train_size": n, "batch_size": 32, "effective_lr": 0.05, "seed": seed, "state": "ok",
                         "test_acc": 0.98 + 0.001 * (i - 2), "arm": "epochs"})
            for arm in bn_budget.ARMS:
                for b in GRID:
                    for k in range(4):
                        acc = (0.98 if b < breaks[(n, arm)] else 0.90) - 0.002 * abs(k - 1)
                        rows.append({"train_size": n, "batch_size": b, "effective_lr": 0.05 * b / 32 / 2 ** k,
                                     "seed": seed, "state": "ok", "test_acc": acc + 0.001 * (i - 2), "arm": arm})
    return pd.DataFrame(rows)


def by_n(epochs, steps):
    return {**{(n, "epochs"): b for n, b in zip(NS, epochs)}, **{(n, "steps"): b for n, b in zip(NS, steps)}}


@pytest.mark.parametrize("epochs, steps, c, predictor, verdict", [
    ((500, 1000, 2000), (500, 1000, 2000), 0.0, "B/N", Verdict.REPRODUCED),
    ((1000, 1000, 1000), (1000, 1000, 1000), 0.0, "B/B_crit", Verdict.PARTLY),
    ((500, 1000, 2000), (math.inf,) * 3, 0.0, "steps", Verdict.NOT_REPRODUCED),
    ((500, 1000, 2000), (4000, 1000, 250), 0.0, "none", Verdict.NOT_REPRODUCED),
    ((500, 1000, 2000), (500, 1000, 2000), 2.0, "undecided", Verdict.INCONCLUSIVE),
    ((math.inf,) * 3, (math.inf,) * 3, 0.0, "undecided", Verdict.NOT_TESTABLE),
])
def test_the_break_test_names_each_predictor(epochs, steps, c, predictor, verdict):
    table = bn_budget.goyal_breaks(goyal_rows(by_n(epochs, steps)))
    assert len(table) == 6 and not any(table["problems"])
    test = bn_budget.break_test(table, ratio(c), bcrit_valid=True)
    assert (test.predictor, test.verdict) == (predictor, verdict), test.why


def test_a_partial_sweep_is_not_testable_and_names_its_unfinished_runs():
    """`bsresearch report --partial` while the sweep runs: an (N, arm) whose runs beyond the baseline have none
    finished reads as runs not finished, not as an error."""
    rows = goyal_rows(by_n((500, 1000, 2000), (math.inf,) * 3))
    pending = (rows["train_size"] == 40000) & (rows["arm"] == "steps") & (rows["batch_size"] != 32)
    rows.loc[pending, ["state", "test_acc"]] = ["pending", math.nan]
    table = bn_budget.goyal_breaks(rows)
    steps40 = table[(table["n"] == 40000) & (table["arm"] == "steps")].iloc[0]
    assert steps40["problems"] and "not finished" in steps40["problems"][0]
    assert bn_budget.break_test(table, ratio(0.0), bcrit_valid=True).verdict == Verdict.NOT_TESTABLE


def test_a_break_beyond_the_grid_at_the_largest_n_is_a_lower_bound():
    table = bn_budget.goyal_breaks(goyal_rows(by_n((500, 1000, 2000), (1000, 4000, math.inf))))
    test = bn_budget.break_test(table, ratio(0.0), bcrit_valid=True)
    assert test.shift == pytest.approx(math.log2(8000 / 1000)) and test.shift_high == math.inf
    assert test.predictor == "none"      # >= 3 octaves: neither B/N (+2) nor B_crit (0)


def test_a_best_lr_on_the_bottom_edge_makes_the_break_not_testable():
    rows = goyal_rows(by_n((500, 1000, 2000), (500, 1000, 2000)))
    k3 = np.isclose(rows["effective_lr"], 0.05 * rows["batch_size"] / 32 / 8) & (rows["batch_size"] == 250)
    rows.loc[k3, "test_acc"] += 0.01
    test = bn_budget.break_test(bn_budget.goyal_breaks(rows), ratio(0.0), bcrit_valid=True)
    assert test.verdict == Verdict.NOT_TESTABLE and "bottom edge" in test.why


def hoffer_rows(at_epochs, at_steps, spread=0.002):
    rows = []
    for n, ge, gs in zip(NS, at_epochs, at_steps):
        for i, seed in enumerate(SEEDS):
            e = spread * (i - 2)
            for variant, acc in (("sb", 0.98), ("lb_sqrt_gbn", 0.98 + ge), ("lb_sqrt_gbn_ra", 0.98 + gs)):
                rows.append({"train_size": n, "variant": variant, "seed": seed, "state": "ok", "test_acc": acc + e})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("at_epochs, at_steps, c, predictor, verdict", [
    ((-0.05, -0.04, -0.03), (0.0, 0.0, 0.0), 0.0, "steps", Verdict.REPRODUCED),
    ((-0.05, -0.04, -0.03), (-0.05, -0.025, 0.0), 0.0, "B/N", Verdict.PARTLY),
    ((-0.05, -0.04, -0.03), (-0.08, -0.06, -0.04), 0.0, "B/N", Verdict.NOT_REPRODUCED),
    ((-0.05, -0.04, -0.03), (-0.03, -0.03, -0.03), 0.0, "B/B_crit", Verdict.NOT_REPRODUCED),
    ((-0.05, -0.04, -0.03), (-0.02, -0.03, -0.05), 0.0, "none", Verdict.NOT_REPRODUCED),
    ((-0.05, -0.04, -0.03), (-0.05, -0.025, 0.0), 2.0, "undecided", Verdict.INCONCLUSIVE),
    ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), 0.0, "undecided", Verdict.NOT_TESTABLE),
])
def test_the_gap_test_names_each_predictor(at_epochs, at_steps, c, predictor, verdict):
    test = bn_budget.gap_test(bn_budget.hoffer_gaps(hoffer_rows(at_epochs, at_steps)), ratio(c), bcrit_valid=True)
    assert (test.predictor, test.verdict) == (predictor, verdict), test.why


def test_a_straddling_contrast_is_undecided_and_adds_seeds():
    test = bn_budget.gap_test(bn_budget.hoffer_gaps(hoffer_rows((-0.05,) * 3, (-0.03, -0.03, -0.02), 0.01)),
                              ratio(0.0), bcrit_valid=True)
    assert test.predictor == "undecided" and test.extend_seeds and test.verdict == Verdict.INCONCLUSIVE


@pytest.mark.parametrize("epochs, steps, predictor, verdict", [
    ((500, 1000, 2000), (500, 1000, 2000), "B/N", Verdict.REPRODUCED),           # its alternative untested
    ((1000, 1000, 1000), (1000, 1000, 1000), "undecided", Verdict.INCONCLUSIVE),  # would be B/B_crit if valid
    ((500, 1000, 2000), (math.inf,) * 3, "steps", Verdict.NOT_REPRODUCED),
])
def test_without_a_valid_b_crit_at_the_ends_the_break_test_never_names_b_over_b_crit(epochs, steps, predictor,
                                                                                       verdict):
    test = bn_budget.break_test(bn_budget.goyal_breaks(goyal_rows(by_n(epochs, steps))), ratio(0.0),
                                bcrit_valid=False)
    assert (test.predictor, test.verdict, test.separable) == (predictor, verdict, False), test.why


@pytest.mark.parametrize("at_steps, predictor", [
    ((-0.05, -0.025, 0.0), "B/N"), ((-0.03, -0.03, -0.03), "undecided"), ((0.0, 0.0, 0.0), "steps")])
def test_without_a_valid_b_crit_at_the_ends_the_gap_test_never_names_b_over_b_crit(at_steps, predictor):
    test = bn_budget.gap_test(bn_budget.hoffer_gaps(hoffer_rows((-0.05, -0.04, -0.03), at_steps)), ratio(0.0),
                              bcrit_valid=False)
    assert test.predictor == predictor and not test.separable, test.why


@pytest.mark.parametrize("v10k, v20k, v40k, expected", [
    (True, False, True, True), (False, True, True, False), (True, True, False, False)])
def test_b_crit_can_be_tested_when_it_is_valid_at_the_smallest_and_largest_n(v10k, v20k, v40k, expected):
    table = pd.DataFrame({"n": [40000, 10000, 20000], "valid": [v40k, v10k, v20k]})   # unsorted: the ends are by N
    assert bn_budget.valid_at_ends(table) is expected
    assert not bn_budget.valid_at_ends(table[table["n"] == 10000])                      # one N: no shift to read


def test_bcrit_by_n_fits_each_n_and_the_shift_is_their_ratio():
    rows = []
    for n, b_crit in ((10000, 40.0), (40000, 40.0)):
        for b in (4, 8, 16, 40, 80, 200, 400, 1000):
            for m, lr in enumerate((0.05, 0.1, 0.2)):
                for i, seed in enumerate(SEEDS):
                    s = 800 * (1 + b_crit / b) * (1 + 0.2 * abs(m - 1)) * (1 + 0.02 * (i - 2))
                    rows.append({"train_size": n, "batch_size": b, "lr": lr, "seed": seed, "state": "ok",
                                 "steps_to_target": s, "examples_to_target": s * b})
    bcrit = bn_budget.critical_batch_by_n(pd.DataFrame(rows))
    assert list(bcrit["n"]) == [10000, 40000] and bcrit["valid"].all()
    assert bcrit["b_crit"].to_numpy() == pytest.approx([40.0, 40.0], rel=0.05)
    shift = bn_budget.bcrit_shift(bcrit)
    assert shift.ratio == pytest.approx(1.0, rel=0.05) and bn_budget.separable(shift)
    assert fit_critical_batch([8, 80], [900, 1200]).n_points == 2


# ----------------------------------------------------------------------------- version 6: Hoffer's gap, two contrasts
def v6_runs(lb_epochs, lb_steps, lb_examples, sb_long=0.0, noise=0.001, seeds=range(50, 58)):
    """bn_budget_hoffer_v6's variants: sb at 0.97 (10 epochs; sb_long more for the ladder's longer runs), and the
    large batch's gap (fraction) per N in each arm, given as functions of N (lb_examples at 10k and 20k only)."""
    rng = np.random.default_rng(0)
    means = {}
    for n, k in bn_budget.N_NAMES.items():
        means[f"sb_{k}"] = 0.97
        means[f"lbe_{k}"] = 0.97 + lb_epochs(n)
        means[f"lbs_{k}"] = 0.97 + lb_steps(n)
    means.update({"sb2_n10k": 0.97 + sb_long / 2, "sb4_n10k": 0.97 + sb_long, "sb2_n20k": 0.97 + sb_long / 2})
    means.update({"lbx_n10k": means["sb4_n10k"] + lb_examples(10000),
                  "lbx_n20k": means["sb2_n20k"] + lb_examples(20000)})
    # at 40k, 10 epochs are 400 000 examples: lbe_n40k is both arms' run, lb_examples(40000) is lb_epochs(40000)
    rows = [{"variant": v, "train_size": {"n10k": 10000, "n20k": 20000, "n40k": 40000}[v.split("_")[-1]],
             "seed": s, "state": "ok", "test_acc": m + rng.normal(0, noise)} for v, m in means.items() for s in seeds]
    return pd.DataFrame(rows)


def test_welch_contrast_of_two_groups_is_welchs_interval():
    from bsresearch.stats import welch_interval
    rng = np.random.default_rng(1)
    a, b = pd.Series(rng.normal(1, 0.3, 6)), pd.Series(rng.normal(0.5, 0.1, 9))
    d = welch_interval(a, b)
    assert bn_budget.welch_contrast([(a, 1.0), (b, -1.0)]) == pytest.approx((d.diff, d.low, d.high))


def test_each_predictor_of_hoffers_gap_in_version_6():
    flat_c = bn_budget.octaves(ratio(0.0))
    steps = bn_budget.predictor_gap_test(v6_runs(lambda n: -0.05, lambda n: 0.0, lambda n: -0.05), flat_c)
    assert steps.predictor == "steps" and steps.verdict == Verdict.REPRODUCED
    assert steps.table["delta_s"].tolist() == pytest.approx([0.05] * 3, abs=0.002)
    both = bn_budget.predictor_gap_test(v6_runs(lambda n: -0.05, lambda n: 0.0, lambda n: -0.08), flat_c)
    assert both.predictor == "steps and B/N" and both.verdict == Verdict.PARTLY
    assert both.delta_n[0] == pytest.approx(0.03, abs=0.002)
    b_over_n = bn_budget.predictor_gap_test(
        v6_runs(lambda n: -0.01 if n == 40000 else -0.03, lambda n: -0.01 if n == 40000 else -0.03,
                lambda n: -0.04), flat_c)
    assert b_over_n.predictor == "B/N" and b_over_n.verdict == Verdict.NOT_REPRODUCED
    b_crit = bn_budget.predictor_gap_test(v6_runs(lambda n: -0.03, lambda n: -0.03, lambda n: -0.03), flat_c)
    assert b_crit.predictor == "B/B_crit"
    assert bn_budget.predictor_gap_test(v6_runs(lambda n: -0.03, lambda n: -0.03, lambda n: -0.03),
                                        None).predictor == "cannot be told apart"
    wide = bn_budget.predictor_gap_test(v6_runs(lambda n: -0.05, lambda n: 0.0, lambda n: -0.05, noise=0.02), flat_c)
    assert wide.predictor == "cannot be told apart" and wide.verdict == Verdict.INCONCLUSIVE
    nothing = bn_budget.predictor_gap_test(v6_runs(lambda n: 0.0, lambda n: 0.0, lambda n: 0.0), flat_c)
    assert nothing.verdict == Verdict.NOT_TESTABLE and "nothing to explain" in nothing.why


def test_the_ladder_says_whether_the_small_batch_is_under_trained():
    runs = v6_runs(lambda n: -0.05, lambda n: 0.01, lambda n: -0.05, sb_long=0.012)
    ladder = bn_budget.predictor_gap_test(runs, None).ladder.set_index(["n", "k"])
    assert ladder.loc[(10000, 4), "under_trained"] and ladder.loc[(10000, 4), "u"] == pytest.approx(0.012, abs=0.002)
    # against the longest small batch the large batch's +1 point at equal steps turns into about -0.2
    assert ladder.loc[(10000, 4), "gap_steps_longest"] == pytest.approx(-0.002, abs=0.002)
    missing = bn_budget.predictor_gap_test(runs[runs["variant"] != "sb4_n10k"], None)
    assert missing.verdict == Verdict.NOT_TESTABLE and "sb4_n10k: fewer than 2 finished seeds" in missing.why


def test_the_break_figure_draws_both_predictions_when_only_the_epochs_arm_breaks():
    """reports/bn_budget_goyal's caption promises the B/N and B/B_crit lines; with no steps-arm break they go
    through the epochs arm's smallest-N break (its committed breaks.csv: 500 at 10k)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bsresearch.plots.findings.bn_budget import break_vs_n
    table = pd.DataFrame([{"n": n, "arm": arm, "b_break": b, "largest": 4000.0}
                          for n, arm, b in ((10000, "epochs", 500.0), (20000, "epochs", 1000.0),
                                            (40000, "epochs", 2000.0), (10000, "steps", math.inf),
                                            (20000, "steps", math.inf), (40000, "steps", math.inf))])
    test = bn_budget.PredictorTest("break", "undecided", math.nan, math.nan, math.nan, 0.0, -0.4, 0.3, True, table,
                                   Verdict.NOT_TESTABLE, "edge", False)
    bcrit = pd.DataFrame({"n": [10000, 20000, 40000], "b_crit": [42.0, 40.0, 40.0]})
    fig, ax = plt.subplots()
    break_vs_n(ax, test, bcrit)
    lines = {line.get_label(): line for line in ax.get_lines()}
    b_over_n = lines["B/N fixed, through the epochs arm's break at N = 10000"]
    assert list(b_over_n.get_ydata()) == pytest.approx([500, 1000, 2000])
    b_crit = lines["B/B_crit fixed, through the epochs arm's break at N = 10000"]
    assert list(b_crit.get_ydata()) == pytest.approx([500, 500 * 40 / 42, 500 * 40 / 42])
    plt.close(fig)


def test_the_break_cells_table_holds_every_cell_the_break_is_decided_from():
    rows = goyal_rows(by_n((500, 1000, 2000), (math.inf,) * 3))
    rows.loc[(rows["train_size"] == 10000) & (rows["batch_size"] == 4000) & (rows["arm"] == "steps")
             & np.isclose(rows["effective_lr"], 0.05 * 4000 / 32) & (rows["seed"] == 40), "state"] = "diverged"
    cells = bn_budget.break_cells(rows)
    assert len(cells) == 3 * 2 * 5 * 4 and (cells["runs"] == 5).all()
    one = cells[(cells["n"] == 10000) & (cells["arm"] == "epochs") & (cells["batch_size"] == 500)].set_index("lr")
    # k = 1 is the best lr; at the break (B = 500) every lr is 8 points below the baseline (0.98 at 32)
    assert one["best"].tolist() == [False, False, True, False] and one["bottom"].tolist() == [True, False, False, False]
    assert one.loc[0.05 * 500 / 32 / 2, "diff"] == pytest.approx(-0.08)
    assert one.loc[0.05 * 500 / 32 / 2, "mean"] == pytest.approx(0.90)
    diverged = cells[(cells["n"] == 10000) & (cells["arm"] == "steps") & (cells["batch_size"] == 4000)]
    top = diverged[np.isclose(diverged["lr"], 0.05 * 4000 / 32)].iloc[0]
    assert (top["ok"], top["diverged"]) == (4, 1) and not top["best"]
    # the table agrees with the test: at every (N, arm, B) its best lr is the one goyal_breaks judges
    assert cells.groupby(["n", "arm", "batch_size"])["best"].sum().eq(1).all()


# ----------------------------------------------------------------------------- version 6: Goyal's break, three arms
def v6_breaks(epochs, steps, examples):
    return pd.DataFrame([{"n": n, "arm": arm, "b_break": b, "b_star": math.nan, "b_linear": math.nan,
                          "largest": 4000.0, "problems": (), "extend_seeds": False}
                         for arm, values in (("epochs", epochs), ("steps", steps), ("examples", examples))
                         for n, b in zip(NS, values, strict=True)])


@pytest.mark.parametrize("epochs, steps, examples, c, predictor, verdict", [
    ((500, 1000, 2000), (math.inf,) * 3, (1000, 1000, 1000), 0.0, "steps", Verdict.NOT_REPRODUCED),
    ((500, 1000, 2000), (math.inf,) * 3, (500, 1000, 2000), 0.0, "steps and B/N", Verdict.PARTLY),
    ((500, 1000, 2000), (math.inf,) * 3, (1000, 2000, math.inf), 0.0, "steps and B/N", Verdict.PARTLY),
    ((500, 1000, 2000), (500, 1000, 2000), (500, 1000, 2000), 0.0, "B/N", Verdict.REPRODUCED),
    ((500, 1000, 2000), (500, 1000, 2000), (2000, 1000, 500), -2.0, "B/B_crit", Verdict.PARTLY),
    ((500, 1000, 2000), (500, 1000, 2000), (1000, 1000, 1000), 0.0, "cannot be told apart", Verdict.INCONCLUSIVE),
    ((500, 1000, 2000), (math.inf,) * 3, (math.inf,) * 3, 0.0, "cannot be told apart", Verdict.INCONCLUSIVE),
    # beyond the grid at 40k: s_X >= log2(8000 / 4000) = 1, a lower bound that already reads as B/N's
    ((500, 1000, 2000), (math.inf,) * 3, (4000, 4000, math.inf), 0.0, "steps and B/N", Verdict.PARTLY),
])
def test_the_v6_break_test_names_each_predictor(epochs, steps, examples, c, predictor, verdict):
    test = bn_budget.predictor_break_test(v6_breaks(epochs, steps, examples), (c, c - 0.3, c + 0.3))
    assert (test.predictor, test.verdict) == (predictor, verdict), test.why


def test_the_v6_break_test_is_not_testable_without_a_break_or_with_an_edge():
    none = bn_budget.predictor_break_test(v6_breaks((math.inf,) * 3, (math.inf,) * 3, (math.inf,) * 3), None)
    assert none.verdict == Verdict.NOT_TESTABLE and "no break to explain" in none.why
    edge = v6_breaks((500, 1000, 2000), (math.inf,) * 3, (1000, 1000, 1000))
    edge.at[4, "problems"] = ("best lr on the grid's bottom edge at B = 4000",)
    assert bn_budget.predictor_break_test(edge, None).verdict == Verdict.NOT_TESTABLE
    two = v6_breaks((500, 1000, 2000), (math.inf,) * 3, (1000, 1000, 1000))
    assert "arms" in bn_budget.predictor_break_test(two[two["arm"] != "examples"], None).why


def test_the_v6_break_figure_draws_the_three_arms_and_the_lines_through_the_examples_arm():
    """Notebook 47: the B/N and B/B_crit lines go through the examples arm's smallest-N break (s_X is its slope);
    a break beyond the grid is an open marker at 2x the largest batch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bsresearch.plots.findings.bn_budget import break_vs_n
    test = bn_budget.predictor_break_test(v6_breaks((500, 1000, 2000), (1000, 2000, 4000), (250, 1000, math.inf)),
                                          (0.0, -0.3, 0.3))
    bcrit = pd.DataFrame({"n": list(NS), "b_crit": [100.0, 100.0, 400.0]})
    fig, ax = plt.subplots()
    break_vs_n(ax, test, bcrit, anchor_arms=("examples", "steps", "epochs"))
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert {"break, epochs arm", "break, steps arm", "break, examples arm",
            "examples arm: no break up to 4000 (drawn at 2x)"} <= set(lines)
    assert list(lines["break, examples arm"].get_ydata()) == pytest.approx([250, 1000, 8000])
    through = "through the examples arm's break at N = 10000"
    assert list(lines[f"B/N fixed, {through}"].get_ydata()) == pytest.approx([250 * n / NS[0] for n in NS])
    assert list(lines[f"B/B_crit fixed, {through}"].get_ydata()) == pytest.approx([250, 250, 1000])
    plt.close(fig)


def test_the_v6_break_figure_draws_the_b_crit_line_from_the_c_the_test_used_when_no_table_is_given():
    """Notebook 47 passes no B_crit table: the line is the c the test compared (here -1 octave from 10k to 40k, so
    -0.5 an octave of N), whether it came from the own setting or version 5's plain SGD."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bsresearch.plots.findings.bn_budget import break_vs_n
    test = bn_budget.predictor_break_test(v6_breaks((500, 1000, 2000), (1000, 2000, 4000), (1000, 1000, 1000)),
                                          (-1.0, -1.3, -0.7))
    fig, ax = plt.subplots()
    break_vs_n(ax, test, anchor_arms=("examples", "steps", "epochs"))
    lines = {line.get_label(): line for line in ax.get_lines()}
    line = lines["B/B_crit fixed (c = -1.00 octaves), through the examples arm's break at N = 10000"]
    assert list(line.get_ydata()) == pytest.approx([1000, 1000 / 2 ** 0.5, 500])
    plt.close(fig)
    unknown = bn_budget.predictor_break_test(v6_breaks((500, 1000, 2000), (1000, 2000, 4000), (1000, 1000, 1000)),
                                             None)
    fig, ax = plt.subplots()
    break_vs_n(ax, unknown, anchor_arms=("examples", "steps", "epochs"))
    assert not any(line.get_label().startswith("B/B_crit") for line in ax.get_lines())   # no c, no line
    plt.close(fig)


def test_goyal_breaks_reads_the_examples_arm_of_the_v6_design():
    rows = goyal_rows(by_n((500, 1000, 2000), (math.inf,) * 3))
    examples = rows[rows["arm"] == "steps"].assign(arm="examples")
    examples.loc[examples["batch_size"] >= 1000, "test_acc"] -= 0.08     # breaks at 1000 at every N
    table = bn_budget.goyal_breaks(pd.concat([rows, examples], ignore_index=True))
    test = bn_budget.predictor_break_test(table, (0.0, -0.3, 0.3))
    assert test.steps_matter and test.shift == 0 and test.predictor == "steps", test.why


# ------------------------------------------------------------------------------ version 6: own-setting B_crit
BCRIT_B = (32, 64, 125, 250, 500, 1000, 2000, 4000)
RUNGS = (1, 2, 4, 8, 16, 32)


def own_setting_runs(b_crit, s_min=200, seeds=range(50, 55), spread=0.0):
    """A run reaches 0.98 when its steps (epochs x N // B) cover S(B) = s_min (1 + b_crit(N) / B) at lr k1 (seed i
    needs (1 + spread (i - 2)) times that), twice that at k0 and k2 (so k1 is every cell's best lr); else 0.90."""
    rows = []
    for n in (10000, 40000):
        for b in BCRIT_B:
            for e in RUNGS:
                for k, need in ((0, 2.0), (1, 1.0), (2, 2.0)):
                    for i, seed in enumerate(seeds):
                        enough = e * (n // b) >= need * (1 + spread * (i - 2)) * s_min * (1 + b_crit[n] / b)
                        rows.append({"train_size": n, "batch_size": b, "budget_amount": float(e),
                                     "lr": 0.05 / 2 ** k, "seed": seed, "state": "ok",
                                     "test_acc": (0.98 if enough else 0.90) - 0.002 * abs(k - 1) + 0.0005 * (i - 2)})
    return pd.DataFrame(rows)


def test_own_setting_steps_are_the_first_rung_that_reaches_the_target_at_the_held_out_lr():
    truth = {10000: 100.0, 40000: 400.0}
    steps = bn_budget.own_setting_steps(own_setting_runs(truth))
    assert len(steps) == 2 * len(BCRIT_B) * 5 and not steps["edge"].any()
    assert steps["target"].unique().tolist() == pytest.approx([0.97])      # B = 32 at 16 epochs (k1), minus 1 point
    for row in steps.itertuples():
        need = 200 * (1 + truth[row.n] / row.batch_size)
        expected = next((e for e in RUNGS if e * (row.n // row.batch_size) >= need), math.nan)
        assert row.epochs == expected or (math.isnan(row.epochs) and math.isnan(expected))


def test_a_batch_size_enters_the_own_setting_fit_when_enough_seeds_reached_the_target():
    """in_fit, the one rule that the fit and its figure share: (N, B) with >= min_reached seeds that reached the
    target, and of those only the seeds that did; the rule is per N, never pooled across N."""
    steps = pd.DataFrame({"n": [10000] * 6 + [40000] * 3, "batch_size": [32, 32, 32, 64, 64, 64, 32, 32, 32],
                          "seed": [50, 51, 52] * 3,
                          "steps": [10.0, 12.0, math.nan, 5.0, 6.0, 7.0, 20.0, math.nan, math.nan]})
    assert bn_budget.in_fit(steps, min_reached=2).tolist() == [True, True, False, True, True, True,
                                                                False, False, False]
    assert bn_budget.in_fit(steps, min_reached=3).tolist() == [False] * 3 + [True] * 3 + [False] * 3


def test_own_setting_bcrit_recovers_a_known_critical_batch_and_its_shift():
    truth = {10000: 100.0, 40000: 400.0}
    table, c = bn_budget.own_setting_bcrit(bn_budget.own_setting_steps(own_setting_runs(truth, spread=0.3)),
                                           resamples=200)
    for row in table.itertuples():
        assert row.valid and row.n_batches >= 6
        assert truth[row.n] / 2 <= row.b_crit <= 2 * truth[row.n]      # the ladder resolves S to a factor 2
        assert row.low < row.high and row.low <= row.b_crit * (1 + 1e-9) and row.b_crit <= row.high * (1 + 1e-9)
    assert abs(c[0] - 2.0) < 1 and c[1] <= c[0] <= c[2]
    flat, c_flat = bn_budget.own_setting_bcrit(bn_budget.own_setting_steps(own_setting_runs(
        {10000: 200.0, 40000: 200.0})), resamples=200)
    assert abs(c_flat[0]) < 0.5


def test_predictor_c_is_the_own_setting_c_where_it_is_measured_and_version_5s_plain_sgd_c_otherwise():
    plain = (-0.06, -0.40, 0.29)
    runs = own_setting_runs({10000: 100.0, 40000: 400.0}, spread=0.3)
    own = bn_budget.predictor_c(runs, plain, "bcrit_v6", resamples=200)
    c, source, table = own.c, own.source, own.table
    assert own.steps.equals(bn_budget.own_setting_steps(runs)) and own.runs is runs
    _, expected = bn_budget.own_setting_bcrit(bn_budget.own_setting_steps(runs), resamples=200)
    assert c == expected and source == "B_crit in the designs' own setting (bcrit_v6)" and table["valid"].all()
    # too few batch sizes reach the target at 10k (the largest need more than the 32-epoch rung): not measured
    short = own_setting_runs({10000: 100.0, 40000: 400.0}, s_min=1200)
    own = bn_budget.predictor_c(short, plain, "bcrit_v6", resamples=50)
    c, source, table = own.c, own.source, own.table
    assert c == plain and source.startswith("plain-SGD c of version 5 (the own-setting c is not measured: N = 10000:")
    assert not table["valid"].iloc[0]
    own = bn_budget.predictor_c(None, plain, "bcrit_v6")
    assert (own.c, own.source) == (plain, "plain-SGD c of version 5 (bcrit_v6 has not run)")
    assert own.table.empty and own.steps.empty and own.runs.empty
    # a sweep still running (one run pending, one failed) is not read, though its finished runs would give a c
    running = runs.copy()
    running.loc[running.index[:2], "state"] = ["pending", "failed"]
    own = bn_budget.predictor_c(running, plain, "bcrit_v6", resamples=50)
    c, source, table = own.c, own.source, own.table
    assert c == plain and table.empty and own.steps.empty
    assert source == f"plain-SGD c of version 5 (bcrit_v6: 2 of {len(runs)} runs have not ended ok or diverged)"


def test_the_own_setting_figure_draws_each_seed_the_fit_and_says_whether_b_crit_is_valid():
    """Notebook 43 and 47's b_crit_own_setting: per N the fitted curve S_min (1 + B_crit / B) through the medians,
    the batch sizes that too few seeds reached drawn open, and the protocol's validity in the label."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bsresearch.plots.findings.bn_budget import bcrit_steps
    steps = bn_budget.own_setting_steps(own_setting_runs({10000: 100.0, 40000: 400.0}, s_min=600))
    table, _ = bn_budget.own_setting_bcrit(steps, resamples=50)
    fig, ax = plt.subplots()
    caption = bcrit_steps(ax, steps, table)
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert len(labels) == 2 and all(label.startswith(f"N = {n}: B_crit ") for label, n in zip(labels, (10000, 40000)))
    for label, row in zip(labels, table.itertuples()):
        assert ("(valid)" in label) == bool(row.valid)
        assert label.endswith("(valid)") or f"not valid: {row.n_batches} batch sizes" in label
    curves = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
    for curve, row in zip(curves, table.itertuples()):
        b, y = curve.get_xdata(), curve.get_ydata()
        assert y == pytest.approx(row.s_min * (1 + row.b_crit / b))
    # at 10k with S_min 600 the batch sizes >= 1000 never reach the target by 32 epochs: no marker for them at all,
    # and every seed of the fitted ones is drawn
    reached = steps.dropna(subset=["steps"])
    drawn = sum(len(line.get_xdata()) for line in ax.get_lines() if line.get_marker() == ".")
    assert drawn == len(reached) and "at least 3 seeds" in caption
    assert "B = 32's mean test accuracy at 16 epochs at its best lr, less 1 point)" in caption
    assert "at least 6 batch sizes in the fit" in caption
    plt.close(fig)


def test_the_own_setting_report_writes_the_steps_it_was_given_and_names_the_c_source(tmp_path):
    """report_bcrit_own_setting draws from predictor_c's own tables (no second read of the sweep): its CSV is
    predictor_c's steps, and the caption names the runs it was given and where c came from."""
    import matplotlib
    matplotlib.use("Agg")

    from bsresearch.plots.findings.bn_budget import report_bcrit_own_setting
    runs = own_setting_runs({10000: 100.0, 40000: 400.0}, spread=0.3).assign(sweep="bcrit_v6", budget_kind="epochs")
    own = bn_budget.predictor_c(runs, (-0.06, -0.40, 0.29), "bcrit_v6", resamples=50)
    report_bcrit_own_setting(own, tmp_path)
    written = pd.read_csv(tmp_path / "b_crit_steps.csv")
    assert written[["n", "batch_size", "seed", "steps"]].equals(own.steps[["n", "batch_size", "seed", "steps"]])
    caption = (tmp_path / "b_crit_own_setting.txt").read_text()
    assert f"c: {own.source}." in caption and f"Sweep bcrit_v6 ({len(runs)} runs, seeds 50, 51, 52, 53, 54)" in caption
    assert (tmp_path / "b_crit_own_setting.png").stat().st_size > 0
