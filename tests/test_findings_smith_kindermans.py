"""Smith, Kindermans, Ying & Le: the pre-registered ramp-vs-decay comparison on made-up runs."""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bsresearch.config import ConfigError
from bsresearch.findings.smith_kindermans import compare_schedules
from bsresearch.findings.verdict import Verdict
from bsresearch.plots.findings.smith_kindermans import curves_by_schedule


def rows(ramp_acc, decay_acc, ramp_steps=560, decay_steps=1000):
    out = [{"variant": "ramp", "state": "ok", "test_acc": a, "steps": ramp_steps, "seed": i}
           for i, a in enumerate(ramp_acc)]
    out += [{"variant": "decay", "state": "ok", "test_acc": a, "steps": decay_steps, "seed": i}
            for i, a in enumerate(decay_acc)]
    return pd.DataFrame(out)


def test_equal_accuracy_with_fewer_updates_is_reproduced():
    result = compare_schedules(rows([0.900, 0.902, 0.898, 0.901, 0.899], [0.901, 0.899, 0.900, 0.902, 0.898]))
    assert result.verdict == Verdict.REPRODUCED and result.steps_ratio == pytest.approx(0.56)
    assert -0.01 <= result.low < result.diff < result.high <= 0.01 and result.n_ramp == 5


def test_the_verdict_follows_the_interval_and_the_updates():
    wide = compare_schedules(rows([0.90, 0.93, 0.88, 0.92, 0.89], [0.90, 0.90, 0.90, 0.90, 0.91]))
    assert wide.low < -0.01 < wide.high and wide.verdict == Verdict.INCONCLUSIVE   # straddles the margin
    worse = compare_schedules(rows([0.86, 0.87, 0.86, 0.87, 0.86], [0.90, 0.90, 0.91, 0.90, 0.90]))
    assert worse.verdict == Verdict.NOT_REPRODUCED and worse.high < -0.01
    more_updates = compare_schedules(rows([0.9] * 3 + [0.901] * 2, [0.9] * 5, ramp_steps=1200))
    assert more_updates.verdict == Verdict.NOT_REPRODUCED
    one_seed = compare_schedules(rows([0.9], [0.9, 0.91]))
    assert one_seed.verdict == Verdict.NOT_TESTABLE
    better = compare_schedules(rows([0.93, 0.94, 0.93, 0.94, 0.935], [0.90, 0.90, 0.91, 0.90, 0.90]))
    assert better.verdict == Verdict.PARTLY and better.low > 0.01   # better than decay by more than the margin


def test_missing_columns_are_one_clear_error():
    with pytest.raises(ConfigError, match="no column 'steps'"):
        compare_schedules(rows([0.9, 0.9], [0.9, 0.9]).drop(columns="steps"))


def test_curves_draw_one_line_per_schedule():
    history = pd.DataFrame([{"variant": v, "seed": s, "epoch": e, "test_acc": 0.5 + 0.1 * e + 0.01 * s}
                            for v in ("decay", "ramp") for s in range(3) for e in range(4)])
    fig, ax = plt.subplots()
    curves_by_schedule(ax, history)
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["decay", "ramp"]
    assert np.allclose(lines[0].get_ydata(), [0.51, 0.61, 0.71, 0.81])
    plt.close(fig)
