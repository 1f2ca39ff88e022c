"""Figures: drawn on the given Axes, log2 batch axes, means over seeds, captions with provenance."""
from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from bsresearch import source
from bsresearch.measure.critical import fit_critical_batch
from bsresearch.plots import (
    figure_grid,
    learning_curves,
    log2_batch_axis,
    metric_vs_batch,
    metric_vs_lr,
    run_curves,
    save_figure,
    steps_to_target_plot,
)


@pytest.fixture
def runs():
    rng = np.random.default_rng(0)
    rows = []
    for b in (32, 400, 4000):
        for lr in (0.001, 0.01):
            for seed in range(3):
                rows.append({"sweep": "toy", "batch_size": b, "lr": lr, "seed": seed, "git_commit": "c0ffee",
                             "budget": "target", "target_loss": 0.01, "max_steps": 9000, "budget_amount": 20.0,
                             "test_acc": 0.9 - 0.01 * np.log2(b) + 0.01 * rng.standard_normal(),
                             "steps_to_target": 1000 * (1 + 256 / b)})
    return pd.DataFrame(rows)


def line_data(ax):
    """(x, y) of the drawn lines (seaborn adds unlabelled copies for markers and empty legend handles)."""
    return [(tuple(line.get_xdata()), tuple(line.get_ydata())) for line in ax.get_lines()
            if len(line.get_xdata()) and line.get_label() != "_nolegend_"]


def test_metric_vs_batch_draws_seed_means_on_a_log2_axis(runs):
    fig, ax = plt.subplots()
    assert metric_vs_batch(ax, runs, "test_acc", hue="lr") is ax
    assert ax.get_xscale() == "log" and ax.xaxis.get_scale() == "log"
    assert ax.xaxis._scale.base == 2
    assert list(ax.get_xticks()) == [32, 400, 4000]
    means = runs.groupby(["lr", "batch_size"])["test_acc"].mean()
    drawn = [xy for xy in line_data(ax) if len(xy[0]) == 3]
    assert len(drawn) == 2
    for lr, (xs, ys) in zip((0.001, 0.01), drawn):  # one mean line per lr, in order
        assert xs == (32, 400, 4000)
        assert np.allclose(ys, means[lr].to_numpy())
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["0.001", "0.01"]
    assert len(ax.collections) >= 1  # the individual seeds
    plt.close(fig)


def test_learning_curves_average_over_seeds():
    history = pd.DataFrame([{"batch_size": b, "seed": s, "step": step, "train_loss": (s + 1) / (step + 1)}
                            for b in (8, 64) for s in range(2) for step in (0, 10, 100)])
    fig, ax = plt.subplots()
    learning_curves(ax, history, "train_loss", hue="batch_size", errorbar=None)
    (xs, ys), _ = line_data(ax)[:2]
    assert xs == (10, 100) and np.allclose(ys, [1.5 / 11, 1.5 / 101])  # step 0 left off the log axis
    assert ax.get_yscale() == "log"
    plt.close(fig)


def test_steps_to_target_plot_draws_the_fit(runs):
    table = runs.groupby("batch_size", as_index=False)["steps_to_target"].mean()
    fit = fit_critical_batch(table["batch_size"], table["steps_to_target"])
    fig, ax = plt.subplots()
    steps_to_target_plot(ax, table, fit=fit)
    (bx, by), (fx, fy) = line_data(ax)[:2]
    assert np.allclose(by, table["steps_to_target"])
    assert np.allclose(fy, 1000 * (1 + 256 / np.asarray(fx)), rtol=1e-3)
    assert "B_crit = 256" in ax.get_legend().get_texts()[1].get_text()
    plt.close(fig)


def test_lr_plot_run_curves_and_grid(runs):
    fig, axes = figure_grid(3)
    metric_vs_lr(axes[0], runs, "test_acc")
    assert axes[0].get_xscale() == "log"
    history = pd.DataFrame({"step": [0, 1, 10], "train_loss": [2.0, 1.0, 0.5], "test_loss": [2.0, 1.2, 0.9],
                            "train_acc": [0.1, 0.5, 0.9], "test_acc": [0.1, 0.4, 0.7]})
    run_curves(axes[1], axes[2], history)
    assert len(axes[1].get_lines()) == 2 and axes[1].get_xscale() == "log"
    plt.close(fig)
    fig, ax = plt.subplots()
    log2_batch_axis(ax, "y", [16, 64])
    assert ax.get_yscale() == "log" and list(ax.get_yticks()) == [16, 64]
    plt.close(fig)


def test_many_batch_sizes_get_vertical_labels_that_do_not_overlap():
    sizes = [2, 4, 8, 16, 40, 80, 200, 400, 1000, 2000, 5000, 10000]
    long_labels = [16, 32, 64, 128, 256, 512, 1024, 2048]   # 8 sizes, but 23 characters
    for values, rotation in ((sizes[:4], 0), (sizes, 90), (long_labels, 90)):
        fig, ax = plt.subplots(figsize=(4.6, 3.8))
        ax.plot(values, range(len(values)))
        log2_batch_axis(ax, "x", values)
        fig.canvas.draw()
        labels = [t for t in ax.get_xticklabels() if t.get_text()]
        assert [t.get_text() for t in labels] == [f"{v:g}" for v in values]
        assert all(t.get_rotation() == rotation for t in labels)
        boxes = [t.get_window_extent() for t in labels]
        assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), "neighbouring tick labels overlap"
        plt.close(fig)


def test_save_figure_writes_png_pdf_and_a_caption_with_provenance(runs, tmp_path):
    fig, ax = plt.subplots()
    metric_vs_batch(ax, runs, "test_acc")
    paths = save_figure(fig, tmp_path / "figs" / "acc", "Test accuracy against batch size.", runs=runs)
    assert [p.suffix for p in paths] == [".png", ".pdf", ".txt"] and all(p.stat().st_size > 0 for p in paths)
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and paths[1].read_bytes()[:4] == b"%PDF"
    caption = paths[2].read_text()
    assert caption.startswith("Test accuracy against batch size.")
    assert "Sweep toy" in caption and "commit c0ffee" in caption
    assert "until train loss <= 0.01 (cap 9000 steps)" in caption
    assert caption.rstrip().splitlines()[-1] == source.drawn_at()   # the source the figure was drawn at
    plain = save_figure(fig, tmp_path / "plain", "Just a caption.")
    assert plain[2].read_text() == f"Just a caption.\n{source.drawn_at()}\n"
    plt.close(fig)


def test_headless_outside_notebooks():
    assert matplotlib.get_backend().lower() == "agg"


def test_a_sweep_figures_interval_is_the_tables_t_interval_not_a_bootstrap():
    """One interval everywhere (docs/protocols.md, Statistics conventions item 1): the error bars that
    metric_vs_batch draws are, end for end, the 95% t interval over seeds that stats.summarize writes into the
    summary tables, for the same runs; with 3 seeds a bootstrap would be much narrower and fail this."""
    from matplotlib.collections import LineCollection

    from bsresearch.stats import summarize
    rng = np.random.default_rng(1)
    data = pd.DataFrame([{"batch_size": b, "seed": s, "test_acc": 0.9 - 0.01 * np.log2(b) + rng.normal(0, 0.02)}
                         for b in (32, 400, 4000) for s in range(3)])
    fig, ax = plt.subplots()
    metric_vs_batch(ax, data, "test_acc")
    bars = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(bars) == 1
    drawn = {float(seg[0, 0]): (min(seg[:, 1]), max(seg[:, 1])) for seg in bars[0].get_segments()}
    table = summarize(data, "batch_size", ["test_acc"]).set_index("batch_size")
    assert sorted(drawn) == [32.0, 400.0, 4000.0]
    for b, (low, high) in drawn.items():
        assert low == pytest.approx(table.loc[b, "test_acc_low"], rel=1e-12)
        assert high == pytest.approx(table.loc[b, "test_acc_high"], rel=1e-12)
    plt.close(fig)


def test_learning_curve_bands_are_the_t_interval_over_seeds():
    from bsresearch.stats import t_interval
    history = pd.DataFrame([{"batch_size": 32, "seed": s, "step": t, "train_loss": 1.0 / t + 0.05 * s}
                            for s in range(3) for t in (1, 10, 100)])
    fig, ax = plt.subplots()
    learning_curves(ax, history, "train_loss", hue=None, log_y=False)
    band = ax.collections[0].get_paths()[0].vertices
    _, _, low, high = t_interval(history.loc[history["step"] == 10, "train_loss"])
    at10 = band[np.isclose(band[:, 0], 10), 1]
    assert sorted(at10) == pytest.approx(sorted([low, high]))
    plt.close(fig)
