"""The edge-of-stochastic-stability test (findings/eoss.py, docs/protocols.md#v6-eoss) on synthetic runs whose
settled values are known: each prediction holds or fails exactly where its criterion says, the lr rule picks the
largest eta that trains on every seed, and a diverged seed leaves its batch size out by name."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bsresearch.config import ConfigError
from bsresearch.findings import eoss
from bsresearch.findings.verdict import Verdict

BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024)
SEEDS = (50, 51, 52, 53, 54)
STEPS = (0, 1, 2, 3, 4, 6, 10, 14, 21, 31, 46, 68, 100, 146, 215, 316, 464, 681, 1000, 1467, 2154, 3000)


def run_history(run_id: str, early: float, late: dict[str, float], jitter: float, rng: np.random.Generator,
                start_loss: float = 2.3) -> pd.DataFrame:
    """A history whose measured columns are `early` before the last 30% of measurement rows and late[c] (plus
    noise) in them; train_loss falls from start_loss."""
    n = len(STEPS)
    tail = int(eoss.SETTLED_FRACTION * n)
    rows = []
    for i, step in enumerate(STEPS):
        row = {"run_id": run_id, "step": step, "train_loss": start_loss * (1 - i / (2 * n))}
        for c, v in late.items():
            row[c] = v + jitter * rng.standard_normal() if i >= n - tail else early
        rows.append(row)
    return pd.DataFrame(rows)


def sweep(eta: float = 0.1, batch_ratio=lambda b: 1.0, top_ratio=lambda b: 0.3 * (b / 8) ** 0.25,
          adam_ratio=lambda b: 0.9 if b >= 1024 else 0.5, jitter: float = 0.01, diverged: tuple = (),
          pooled_ratio=None):
    """Runs and histories: SGD at eta with batch sharpness batch_ratio(B) x 2/eta and lambda_max top_ratio(B) x
    2/eta; Adam at 1e-3 with preconditioned sharpness adam_ratio(B) x 38/lr. `diverged`: (B, seed) pairs."""
    rng = np.random.default_rng(0)
    runs, histories = [], []
    for arm, lr in (("sgd", eta), ("adam", 1e-3)):
        for b in BATCHES:
            for s in SEEDS:
                rid = f"{arm}-{b}-{s}"
                state = "diverged" if (b, s) in diverged else "ok"
                runs.append({"run_id": rid, "optimizer": arm, "lr": lr, "batch_size": b, "seed": s,
                             "state": state, "train_loss": 0.5})
                if arm == "sgd":
                    late = {"sharpness": top_ratio(b) * 2 / lr, "batch_sharpness": batch_ratio(b) * 2 / lr,
                            "noise_along_top": 0.1}
                    if pooled_ratio is not None:   # runs that record the ratio of means too
                        late["batch_sharpness_pooled"] = pooled_ratio(b) * 2 / lr
                else:
                    late = {"sharpness": 10.0, "batch_sharpness": 5.0, "noise_along_top": 0.1,
                            "preconditioned_sharpness": adam_ratio(b) * 38 / lr}
                histories.append(run_history(rid, 0.4, late, jitter * (2 / lr), rng))
    return pd.DataFrame(runs), pd.concat(histories, ignore_index=True)


def test_settled_is_the_mean_of_the_last_30_percent_of_the_measurement_rows():
    h = pd.DataFrame({"run_id": "r", "step": range(21), "sharpness": [1.0] * 15 + [3.0, 5.0, 7.0, 9.0, 11.0, 13.0],
                      "batch_sharpness": range(21)})
    h.loc[3, "sharpness"] = math.nan                      # a row where nothing was measured is not counted
    got = eoss.settled(h).iloc[0]
    assert got["measured"] == 20 and got["from_step"] == 15           # floor(0.3 x 20) = 6 rows: steps 15-20
    assert got["sharpness"] == pytest.approx(8.0) and got["batch_sharpness"] == pytest.approx(17.5)


def test_all_three_predictions_hold_where_the_batch_sharpness_sits_at_2_over_eta_and_lambda_max_below():
    runs, history = sweep()
    test = eoss.eoss_test(runs, history, eta=0.1, adam_lr=1e-3)
    assert test.verdict == Verdict.REPRODUCED, test.why
    by = {p.name: p for p in test.predictions}
    assert by["P1"].holds and by["P2"].holds and by["P3"].holds
    assert by["P3"].estimate == pytest.approx(0.25, abs=0.01)          # the slope top_ratio was built with
    assert by["P4"].holds                                              # 0.9 at 1024, 0.5 at 8
    table = eoss.test_table(test)
    assert set(table["verdict"]) == {"reproduced"} and list(table["prediction"]) == ["P1", "P2", "P3", "P4"]


def test_p1_fails_when_the_batch_sharpness_leaves_the_band_at_one_batch_size():
    runs, history = sweep(batch_ratio=lambda b: 0.6 if b == 8 else 1.0)
    test = eoss.eoss_test(runs, history, eta=0.1)
    by = {p.name: p for p in test.predictions}
    assert not by["P1"].holds and by["P1"].estimate == pytest.approx(0.6, abs=0.02)
    assert by["P2"].holds and by["P3"].holds and test.verdict == Verdict.PARTLY


def test_p2_and_p3_fail_when_lambda_max_reaches_the_limit_at_every_batch_size():
    runs, history = sweep(top_ratio=lambda b: 1.0)
    test = eoss.eoss_test(runs, history, eta=0.1)
    by = {p.name: p for p in test.predictions}
    assert not by["P2"].holds and not by["P3"].holds and by["P1"].holds
    assert test.verdict == Verdict.PARTLY
    runs, history = sweep(top_ratio=lambda b: 1.0, batch_ratio=lambda b: 2.0)
    assert eoss.eoss_test(runs, history, eta=0.1).verdict == Verdict.NOT_REPRODUCED


def test_a_diverged_seed_leaves_its_batch_size_out_by_name_and_too_few_left_is_not_testable():
    runs, history = sweep(diverged=((8, 52),))
    test = eoss.eoss_test(runs, history, eta=0.1)
    assert test.left_out == ("B = 8: 1 of 5 seeds not ok",) and "left out: B = 8" in test.why
    assert test.verdict == Verdict.REPRODUCED
    runs, history = sweep(diverged=tuple((b, 50) for b in BATCHES[:4]))
    test = eoss.eoss_test(runs, history, eta=0.1)
    assert test.verdict == Verdict.NOT_TESTABLE and "4 batch sizes count (needs 5)" in test.why


def test_the_lr_rule_picks_the_largest_eta_that_trains_on_every_seed():
    rows, hist = [], []
    for eta in eoss.RULE_ETAS:
        for s in SEEDS:
            rid = f"{eta}-{s}"
            # 0.1 diverges on one seed; 0.05 trains everywhere; 0.01 ends ok but its loss does not halve
            state = "diverged" if (eta == 0.1 and s == 51) else "ok"
            final = 2.0 if eta == 0.01 else 0.4
            rows.append({"run_id": rid, "optimizer": "sgd", "lr": eta, "batch_size": 1024, "seed": s,
                         "state": state, "train_loss": final})
            hist.append({"run_id": rid, "step": 0, "train_loss": 2.3})
    rule = eoss.eta_rule(pd.DataFrame(rows), pd.DataFrame(hist))
    assert rule.eta == 0.05
    trains = dict(zip(rule.table["eta"], rule.table["trains"]))
    assert trains == {0.01: False, 0.02: True, 0.05: True, 0.1: False}
    none = pd.DataFrame(rows).assign(state="failed")
    assert math.isnan(eoss.eta_rule(none, pd.DataFrame(hist)).eta)


def test_the_lr_rule_in_descending_order_reads_only_the_largest_eta_when_it_trains():
    """Protocol 6.4 runs eta = 0.1 first and no smaller eta when it trains: the etas with no runs do not train,
    and the rule picks what the full grid would have picked."""
    rows = [{"run_id": f"r{s}", "optimizer": "sgd", "lr": 0.1, "batch_size": 1024, "seed": s, "state": "ok",
             "train_loss": 0.01} for s in SEEDS]
    hist = pd.DataFrame({"run_id": [f"r{s}" for s in SEEDS], "step": 0, "train_loss": 2.3})
    rule = eoss.eta_rule(pd.DataFrame(rows), hist)
    assert rule.eta == 0.1
    assert rule.table.set_index("eta")["seeds"].to_dict() == {0.01: 0, 0.02: 0, 0.05: 0, 0.1: len(SEEDS)}
    assert not rule.table.set_index("eta").loc[[0.01, 0.02, 0.05], "trains"].any()


def test_p1_reads_the_pooled_batch_sharpness_when_asked_and_runs_without_it_are_not_testable():
    """Version 6.6: P1 on the ratio of means. Here the mean of ratios sits at 0.5 x 2/eta (P1 fails on it) and
    the ratio of means at 1.0 x 2/eta (P1 holds on it); runs that did not record it are not testable on it."""
    runs, history = sweep(batch_ratio=lambda b: 0.5, pooled_ratio=lambda b: 1.0)
    by_ratios = eoss.eoss_test(runs, history, 0.1, 1e-3)
    pooled = eoss.eoss_test(runs, history, 0.1, 1e-3, batch_column="batch_sharpness_pooled")
    assert not by_ratios.predictions[0].holds and pooled.predictions[0].holds
    assert pooled.predictions[0].estimate == pytest.approx(1.0, abs=0.01)
    assert pooled.predictions[0].statistic.startswith("batch sharpness (ratio of means)")
    old_runs, old_history = sweep()
    unrecorded = eoss.eoss_test(old_runs, old_history, 0.1, 1e-3, batch_column="batch_sharpness_pooled")
    assert unrecorded.verdict == Verdict.NOT_TESTABLE and "batch_sharpness_pooled was not recorded" in unrecorded.why
    with pytest.raises(ConfigError, match="batch_column must be one of"):
        eoss.eoss_test(runs, history, 0.1, batch_column="sharpness")
    import matplotlib.pyplot as plt

    from bsresearch.plots.findings.eoss import along_training
    fig, ax = plt.subplots()
    along_training(ax, old_history, old_runs, 0.1, "batch_sharpness_pooled")   # a panel that says so
    assert "not recorded" in ax.texts[0].get_text()
    along_training(ax, history, runs, 0.1, "batch_sharpness_pooled")
    assert len(ax.lines) == len(BATCHES) + 1      # one line per batch size and the limit
    plt.close(fig)
