"""Figures for reports: functions that draw onto a given matplotlib Axes from a DataFrame.

No torch import: figures are drawn anywhere a results table can be read. `save_figure` writes PNG
and PDF plus a caption file stating where the numbers came from (sweep, commit, budget kind).

Modules: sweeps (metric vs batch size or lr, learning curves, steps to target and its critical-batch fit,
variant colours and interval error bars; re-exported here) and systems (throughput, memory, recommendation).
Each finding's own figures are in plots.findings.<name>, beside its analysis bsresearch.findings.<name>
(plots import the analysis; the analysis never imports plots).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

# Scripts, tests and sweep workers draw headless; a notebook kernel (or an explicit MPLBACKEND) keeps its
# own backend, so figures still show inline in JupyterLab.
if "ipykernel" not in sys.modules and not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

if TYPE_CHECKING:
    import pandas as pd
    from numpy.typing import ArrayLike


def log2_batch_axis(ax: plt.Axes, axis: str = "x", values: list[int] | None = None) -> None:
    """A base-2 log axis for batch sizes, ticks at the given (or power-of-two) batch sizes, plain numbers."""
    set_scale = ax.set_xscale if axis == "x" else ax.set_yscale
    set_scale("log", base=2)
    target = ax.xaxis if axis == "x" else ax.yaxis
    if values:
        target.set_major_locator(FixedLocator(sorted(set(values))))
        target.set_minor_locator(NullLocator())
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_formatter(NullFormatter())
    # many sizes, or long labels (16 ... 2048): upright labels would run together in a panel ~4.6 inches wide
    if axis == "x" and values and (len(set(values)) > 8 or sum(len(f"{v:g}") for v in set(values)) > 20):
        ax.tick_params(axis="x", labelrotation=90)


PNG_DPI = 200          # the resolution of a saved PNG ...
PNG_MAX_WIDTH = 1600   # ... lowered for a wide figure, so that the PNG opens whole in a viewer (pixels)


def interval_err(estimate: ArrayLike, low: ArrayLike, high: ArrayLike) -> np.ndarray:
    """Error bars for `ax.errorbar` from an estimate and its interval's ends (arrays or Series alike): the 2 x n
    array [estimate - low, high - estimate], a missing end drawn as no bar."""
    estimate = np.asarray(estimate, dtype=float)
    return np.nan_to_num(np.vstack([estimate - np.asarray(low, dtype=float), np.asarray(high, dtype=float) - estimate]))


def save_figure(fig: plt.Figure, stem: str | Path, caption: str, runs: pd.DataFrame | None = None) -> list[Path]:
    """Write `stem`.png (200 dpi, at most 1600 px wide) and `stem`.pdf, and `stem`.txt holding the caption;
    return the paths.

    The caption should say which sweep, which commit and which budget kind the figure shows; given the
    `runs` table the figure was drawn from (bsresearch.results.load), that line is appended for you. For a
    report folder judged by a pre-registered test (reports/<name>/, findings.protocol), a line names the
    protocol version. A last line names the source commit the figure was drawn at (flagged when the tree had
    uncommitted changes).
    """
    from ..findings.protocol import protocol_line
    from ..source import drawn_at
    if runs is not None:
        from ..results import provenance_caption
        caption = f"{caption.rstrip()}\n{provenance_caption(runs)}"
    if line := protocol_line(Path(stem).parent.name):
        caption = f"{caption.rstrip()}\n{line}"
    caption = f"{caption.rstrip()}\n{drawn_at()}"
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf"), stem.with_suffix(".txt")]
    fig.canvas.draw()   # lays the figure out, so that the tight box below is the one savefig crops to
    width = fig.get_tightbbox().width + 2 * plt.rcParams["savefig.pad_inches"]   # inches
    fig.savefig(paths[0], dpi=min(PNG_DPI, PNG_MAX_WIDTH / width), bbox_inches="tight")
    fig.savefig(paths[1], bbox_inches="tight")
    paths[2].write_text(caption.rstrip() + "\n")
    return paths


from .sweeps import figure_grid, learning_curves, metric_vs_batch, metric_vs_lr, run_curves, steps_to_target_plot  # noqa: E402

__all__ = ["log2_batch_axis", "save_figure", "figure_grid", "learning_curves", "metric_vs_batch", "metric_vs_lr",
           "run_curves", "steps_to_target_plot"]
