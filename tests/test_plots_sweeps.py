"""The packaged sweep report's figures (plots/sweeps.py): an accuracy's interval stays in [0, 1], an interval on a
log axis stays on it (the t interval of the logs), labels name the quantity and its unit, and the report names
the project's folders relative to the project."""
from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402

from bsresearch.plots.sweeps import axis_label, learning_curves, metric_vs_batch, metric_vs_lr  # noqa: E402
from bsresearch.report import shown_path  # noqa: E402
from bsresearch.stats import t_interval  # noqa: E402


def drawn_ys(ax: plt.Axes) -> np.ndarray:
    """Every y value of every line on the axes (the means, the error bars, the seeds' points)."""
    ys = [np.asarray(line.get_ydata(), float) for line in ax.lines]
    for c in ax.collections:
        if isinstance(c, LineCollection):   # error bars
            ys += [np.asarray(segment)[:, 1] for segment in c.get_segments()]
        elif isinstance(c, PathCollection):  # the seeds' points
            ys.append(np.asarray(c.get_offsets())[:, 1])
    return np.concatenate(ys)


def two_seeds(column: str, values: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"batch_size": [16, 16, 64, 64], "seed": [0, 1, 0, 1], "lr": [0.1] * 4, column: values})


def test_an_accuracy_interval_over_two_seeds_is_clipped_to_0_1():
    values = [0.55, 0.99, 0.6, 0.62]
    assert t_interval(values[:2])[3] > 1.5          # the oracle: unclipped, the interval reaches past 1
    fig, ax = plt.subplots()
    metric_vs_batch(ax, two_seeds("test_acc", values), "test_acc")
    ys = drawn_ys(ax)
    assert ys.max() == 1.0 and ys.min() >= 0.0      # drawn up to 1, not beyond
    plt.close(fig)


def test_an_interval_on_a_log_axis_is_the_t_interval_of_the_logs():
    values = [0.01, 0.5, 0.2, 0.21]
    assert t_interval(values[:2])[2] < 0             # the oracle: the arithmetic interval runs below 0
    fig, ax = plt.subplots()
    metric_vs_batch(ax, two_seeds("test_loss", values), "test_loss", log_y=True)
    assert ax.get_yscale() == "log"
    ys = drawn_ys(ax)
    _, _, low, high = t_interval(np.log(values[:2]))
    assert ys.min() > 0 and ys.min() == pytest.approx(math.exp(low)) and ys.max() == pytest.approx(math.exp(high))
    means = list(ax.lines[0].get_ydata())   # the geometric mean over seeds at each batch size
    assert means == pytest.approx([math.sqrt(0.01 * 0.5), math.sqrt(0.2 * 0.21)])
    plt.close(fig)


def test_learning_curves_geometric_band_stays_positive_and_accuracy_band_within_0_1():
    history = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "batch_size": [16] * 4, "step": [1, 2, 1, 2],
                            "train_loss": [1.0, 0.01, 1.2, 0.9], "test_acc": [0.5, 0.99, 0.52, 0.6]})
    fig, (ax, ax_acc) = plt.subplots(1, 2)
    learning_curves(ax, history, "train_loss", geometric=True)
    learning_curves(ax_acc, history, "test_acc", log_y=False)
    band = np.concatenate([p.vertices[:, 1] for c in ax.collections for p in c.get_paths()])
    assert band.min() > 0
    acc_band = np.concatenate([p.vertices[:, 1] for c in ax_acc.collections for p in c.get_paths()])
    assert 0 <= acc_band.min() and acc_band.max() <= 1
    assert ax.get_legend().get_title().get_text() == "batch size (examples per update)"
    plt.close(fig)


def test_labels_name_the_quantity_and_its_unit():
    assert axis_label("noise_b_noise") == "B_noise, gradient noise scale (examples)"
    assert axis_label("b_simple_ema", "tokens") == "B_simple, moving average (tokens)"
    assert axis_label("hessian_top_eigenvalue") == "top Hessian eigenvalue (loss per parameter²)"
    assert axis_label("test_loss", "nats per token") == "test loss (nats per token)"
    assert axis_label("learning_rate") == "learning rate"
    fig, ax = plt.subplots()
    metric_vs_lr(ax, two_seeds("test_acc", [0.5, 0.6, 0.7, 0.8]).assign(lr=[0.1, 0.1, 0.2, 0.2]), "test_acc")
    assert ax.get_legend().get_title().get_text() == "batch size (examples per update)"
    assert ax.get_xlabel() == "learning rate" and ax.get_ylabel() == "test accuracy"
    plt.close(fig)


def test_the_report_names_the_projects_folders_relative_to_the_project(tmp_path):
    (tmp_path / "proj" / "experiments").mkdir(parents=True)
    (tmp_path / "proj" / "pyproject.toml").write_text("[tool.bsresearch]\n")
    out = tmp_path / "proj" / "reports" / "x"
    assert shown_path(tmp_path / "proj" / "runs", out) == "runs"
    assert shown_path(out, out) == "reports/x"
    assert shown_path(tmp_path / "elsewhere", out) == str(tmp_path / "elsewhere")       # outside: absolute
    assert shown_path(tmp_path / "runs", tmp_path / "reports" / "x") == str(tmp_path / "runs")   # no project
