"""The deciding-statistics figure: read from a report's committed tables, every statistic with its interval and the
band the test needs; bad arguments are one line."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bsresearch.plots import deciding

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind, folder, n", [("lm_small_batch", "lm_small_batch", 2),
                                             ("lm_batch_warmup", "lm_batch_warmup", 2), ("lm_cbs", "lm_cbs", 2),
                                             ("noise_mechanism", "steps_to_target_large_mechanism", 4)])
def test_the_readers_take_each_committed_reports_numbers_and_thresholds(kind, folder, n):
    items = deciding.KINDS[kind].read(ROOT / "reports" / folder)
    assert len(items) == n and all(i.low <= i.estimate <= i.high for i in items)
    if kind == "lm_small_batch":     # the table: d_small's threshold is 0.01 x 2.9875
        t = pd.read_csv(ROOT / "reports" / folder / "test.csv").iloc[0]
        assert (items[0].estimate, items[0].low, items[0].high) == (t["estimate 1"], t["low 1"], t["high 1"])
        assert items[1].band == (-deciding.INF, pytest.approx(0.029875)) and items[0].band == (0.0, deciding.INF)
    if kind == "lm_batch_warmup":
        assert items[0].band[1] == pytest.approx(0.020398)
    if kind == "noise_mechanism":
        assert all(i.band == (0.1, 10.0) and i.log and i.inside for i in items)


def test_inside_is_the_interval_within_the_band():
    assert deciding.Deciding("a", 1.0, 0.5, 1.5, (0.0, deciding.INF)).inside
    assert not deciding.Deciding("a", 0.2, -0.1, 0.5, (0.0, deciding.INF)).inside
    assert not deciding.Deciding("a", 0.01, -0.01, 0.03, (-deciding.INF, 0.02)).inside


def test_redraw_writes_the_figure_and_a_caption_naming_the_interval(tmp_path):
    folder = tmp_path / "lm_cbs"
    folder.mkdir()
    (folder / "test.csv").write_text((ROOT / "reports/lm_cbs/test.csv").read_text())
    paths = deciding.redraw("lm_cbs", folder)
    assert [p.name for p in paths] == ["deciding.png", "deciding.pdf", "deciding.txt"]
    caption = (folder / "deciding.txt").read_text()
    assert "t 95% over seeds (on log2 CBS)" in caption and "redrawn from its committed test.csv" in caption


def test_bad_arguments_are_one_line():
    for argv in (["nope", "reports/lm_cbs"], ["lm_cbs", "reports/not_a_report"], []):
        out = subprocess.run([sys.executable, "-m", "bsresearch.plots.deciding", *argv], cwd=ROOT,
                             capture_output=True, text=True)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "KIND: lm_small_batch" in out.stderr
