"""Sharpness against generalization: Kendall tau overall and within slices, on made-up runs."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from bsresearch.config import ConfigError
from bsresearch.findings.sharpness_generalization import DECIDING, finding_test, rank_correlations
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.sharpness_generalization import correlation_plot, gap_scatter


def runs_table(seeds=range(5)):
    """The gap grows with batch size and falls with lr; 'tracks' is the gap plus noise; 'lr_only' follows
    only the lr (so within a fixed lr it carries no information); 'anti' is minus the gap."""
    rng = np.random.default_rng(0)
    rows = []
    for s in seeds:
        for b in (16, 64, 256, 1024):
            for lr in (0.01, 0.03, 0.1):
                gap = 0.1 * math.log2(b) - 0.5 * math.log10(lr) + 0.05 * rng.standard_normal()
                rows.append({"seed": s, "batch_size": b, "lr": lr, "gap_loss": gap,
                             "tracks": gap + 0.05 * rng.standard_normal(), "lr_only": -math.log(lr) + 0.0 * b,
                             "anti": -gap, "noise_b_simple": rng.standard_normal()})
    return pd.DataFrame(rows)


def test_overall_tau_equals_scipys_and_slices_average_within_groups():
    runs = runs_table()
    table = rank_correlations(runs, "gap_loss", ["tracks", "lr_only"], n_boot=50).set_index(["measure", "scope"])
    expected = scipy_stats.kendalltau(runs["tracks"], runs["gap_loss"]).statistic
    assert table.loc[("tracks", "all"), "tau"] == pytest.approx(expected)
    # within a fixed lr and seed only the batch size varies: lr_only is constant there, tau undefined
    assert math.isnan(table.loc[("lr_only", "varying batch_size"), "tau"])
    one = runs[(runs["lr"] == 0.03) & (runs["seed"] == 2)]
    slices = [scipy_stats.kendalltau(g["tracks"], g["gap_loss"]).statistic
              for _, g in runs.groupby(["lr", "seed"])]
    assert table.loc[("tracks", "varying batch_size"), "tau"] == pytest.approx(np.mean(slices))
    assert len(one) == 4 and table.loc[("tracks", "all"), "n_runs"] == 60


def test_verdicts_follow_the_interval_and_the_predicted_sign():
    runs = runs_table()
    table = rank_correlations(runs, "gap_loss", ["tracks", "anti", "noise_b_simple"], n_boot=200)
    table = table.set_index(["measure", "scope"])
    for scope in ("all", "varying batch_size", "varying lr"):
        assert table.loc[("noise_b_simple", scope), "predicted"] == 0
        assert table.loc[("noise_b_simple", scope), "holds"] == "no"   # pure noise: interval contains 0
        assert table.loc[("noise_b_simple", scope), "low"] < 0 < table.loc[("noise_b_simple", scope), "high"]
    # unknown measures get no prediction: a strong positive relation reads "positive", a negative one "negative"
    assert table.loc[("tracks", "all"), "holds"] == "positive" and table.loc[("tracks", "all"), "low"] > 0.5
    assert table.loc[("anti", "all"), "holds"] == "negative"


def test_a_predicted_measure_that_goes_the_other_way_is_opposite():
    runs = runs_table().assign(**{"keskar_phi_eps1e-3": lambda r: -r["gap_loss"]})
    table = rank_correlations(runs, "gap_loss", ["keskar_phi_eps1e-3"], n_boot=100).set_index("scope")
    assert table.loc["all", "predicted"] == 1 and table.loc["all", "holds"] == "opposite"


def test_bad_tables_are_one_clear_error():
    with pytest.raises(ConfigError, match="none of the measures"):
        rank_correlations(runs_table(), "gap_loss", ["nope"])
    with pytest.raises(ConfigError, match="2 or more seeds"):
        rank_correlations(runs_table(seeds=[0]), "gap_loss", ["tracks"])


def test_plot_has_a_row_per_measure():
    fig, ax = plt.subplots()
    table = rank_correlations(runs_table(), "gap_loss", ["tracks", "anti"], n_boot=20)
    assert correlation_plot(ax, table) is ax
    assert [t.get_text() for t in ax.get_yticklabels()] == ["tracks", "anti"]
    plt.close(fig)


def verdict_table(holds: dict[tuple[str, str], str], tau: float = 0.3) -> pd.DataFrame:
    """A rank_correlations-shaped table: every deciding measure and keskar phi in every scope, 'no' unless given."""
    rows = [{"measure": m, "scope": sc, "tau": tau, "low": -0.1, "high": 0.5, "predicted": 1,
             "holds": holds.get((m, sc), "no"), "n_runs": 60}
            for m in (*DECIDING, "keskar_phi_eps1e-3") for sc in ("all", "varying batch_size", "varying lr")]
    return pd.DataFrame(rows)


def test_the_finding_verdict_reads_the_deciding_measures_in_every_scope():
    scopes = ("all", "varying batch_size", "varying lr")
    everywhere = {(m, sc): "yes" for m in DECIDING for sc in scopes}
    assert finding_test(verdict_table(everywhere)).verdict == Verdict.REPRODUCED
    # one deciding measure fails in one scope: some sharpness measure still holds -> partly
    one_short = {**everywhere, (DECIDING[1], "varying lr"): "no"}
    result = finding_test(verdict_table(one_short))
    assert result.verdict == Verdict.PARTLY and f"{DECIDING[0]} (varying lr)" in result.reason
    assert finding_test(verdict_table({("keskar_phi_eps1e-3", "all"): "yes"})).verdict == Verdict.PARTLY
    opposite = {(m, sc): "opposite" for m in DECIDING for sc in scopes}
    assert finding_test(verdict_table(opposite)).verdict == Verdict.NOT_REPRODUCED
    # a relation with no predicted sign never makes it partly
    unpredicted = pd.concat([verdict_table({}), pd.DataFrame([{"measure": "noise_b_simple", "scope": "all", "tau": 0.9,
                             "low": 0.8, "high": 1.0, "predicted": 0, "holds": "positive", "n_runs": 60}])])
    assert finding_test(unpredicted).verdict == Verdict.NOT_REPRODUCED


def test_a_deciding_measure_missing_or_undefined_is_not_testable():
    table = verdict_table({})
    missing = finding_test(table[table["measure"] != DECIDING[1]])
    assert missing.verdict == Verdict.NOT_TESTABLE
    assert missing.reason.startswith(f"not in the table: {DECIDING[1]} (all)")
    nan = table.assign(tau=np.where(table["scope"] == "varying batch_size", np.nan, 0.3))
    assert finding_test(nan).verdict == Verdict.NOT_TESTABLE and "tau undefined" in finding_test(nan).reason


def test_the_pipeline_the_notebook_runs_on_synthetic_runs():
    # worst-case sharpness tracks the gap; adaptive m-sharpness tracks it within lr slices only (it rises
    # with the lr, while the gap falls with it): the deciding pair fails in some scope -> partly
    runs = runs_table().assign(**{DECIDING[0]: lambda r: r["tracks"],
                                  DECIDING[1]: lambda r: 0.1 * np.log2(r["batch_size"]) + 2 * np.log10(r["lr"])})
    table = rank_correlations(runs, "gap_loss", [*DECIDING, "noise_b_simple"], n_boot=40)
    table = table.set_index(["measure", "scope"])
    assert (table.loc[DECIDING[0], "holds"] == "yes").all()
    assert table.loc[(DECIDING[1], "varying batch_size"), "holds"] == "yes"
    assert table.loc[(DECIDING[1], "varying lr"), "holds"] == "opposite"
    assert finding_test(table.reset_index()).verdict == Verdict.PARTLY
    fig, ax = plt.subplots()
    gap_scatter(ax, runs, DECIDING[0], "gap_loss")
    points = [line for line in ax.get_lines() if len(line.get_xdata())]
    assert len(points) == 12 and sum(len(line.get_xdata()) for line in points) == len(runs)   # one per (B, lr)
    assert [t.get_text() for t in ax.get_legend().get_texts()][:5] == ["B = 16", "B = 64", "B = 256", "B = 1024",
                                                                        "lr = 0.01"]
    plt.close(fig)


def test_tau_is_scipys_tau_b_with_ties_and_missing_values():
    from bsresearch.findings.sharpness_generalization import _tau
    rng = np.random.default_rng(3)
    x, y = np.round(rng.standard_normal(40), 1), np.round(rng.standard_normal(40), 1)   # many ties in both
    x[[2, 9]], y[5] = np.nan, np.inf
    keep = np.isfinite(x) & np.isfinite(y)
    assert _tau(x, y) == pytest.approx(scipy_stats.kendalltau(x[keep], y[keep]).statistic, abs=1e-12)
    assert math.isnan(_tau(np.ones(5), np.arange(5.0))) and math.isnan(_tau(np.arange(2.0), np.arange(2.0)))


def test_an_interval_ending_at_zero_up_to_rounding_contains_zero():
    from bsresearch.findings.sharpness_generalization import _verdict
    assert _verdict(-0.3, -1.2e-18, 1) == "no" and _verdict(1e-17, 0.4, 0) == "no"
    assert _verdict(-0.3, -0.01, 1) == "opposite" and _verdict(0.01, 0.4, 1) == "yes"
