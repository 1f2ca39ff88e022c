"""The deciding statistics of a pre-registered test as the eye should read them: each estimate with its interval on
a row of its own, the region its interval must lie in for "reproduced" shaded. Read from a report's committed
tables, so that a report whose runs are on another machine gets the figure too.

    items = KINDS["lm_cbs"].read(Path("reports/lm_cbs"))  # Deciding rows from the report's test.csv
    fig = forest(items, "lm_cbs: partly")
    redraw("lm_cbs", Path("reports/lm_cbs"))             # deciding.png/.pdf/.txt beside its tables

    python -m bsresearch.plots.deciding lm_cbs reports/lm_cbs

KINDS knows the tables of the language-model tests of protocol version 2 (lm_small_batch, lm_batch_warmup,
lm_cbs: their test.csv) and of the noise-scale mechanism test of version 4 (noise_summaries.csv, each summary's r
and its seed-bootstrap interval against [1/10, 10]). A threshold the table states in words ("0.01 x 2.9875") is
read from those words.
"""
from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import plt, save_figure

INF = math.inf


@dataclass(frozen=True)
class Deciding:
    """One deciding statistic: its estimate and interval, and the band its interval must lie in."""
    label: str
    estimate: float
    low: float
    high: float
    band: tuple[float, float]
    log: bool = False        # a ratio: drawn on a log axis

    @property
    def inside(self) -> bool:
        """The interval lies in the band (ends included: the colour of the bar, not the verdict's words)."""
        return self.band[0] <= self.low and self.high <= self.band[1]


def forest(items: Sequence[Deciding], title: str) -> plt.Figure:
    """One row per statistic, each on its own x axis (their units and scales differ): the estimate, its interval
    as a bar, the band it must lie in shaded green, the band's finite ends as dashed lines."""
    fig, axes = plt.subplots(len(items), 1, figsize=(6.4, 1.15 * len(items) + 0.9), squeeze=False)
    for ax, item in zip(axes[:, 0], items):
        ends = [v for v in (*item.band, item.low, item.high, item.estimate) if math.isfinite(v)]
        lo, hi = min(ends), max(ends)
        pad = (hi / lo) ** 0.15 if item.log else 0.15 * (hi - lo or abs(hi) or 1.0)
        lo, hi = (lo / pad, hi * pad) if item.log else (lo - pad, hi + pad)
        ax.axvspan(max(item.band[0], lo), min(item.band[1], hi), color="tab:green", alpha=0.15, lw=0)
        for end in item.band:
            if math.isfinite(end):
                ax.axvline(end, color="tab:green", ls="--", lw=1)
        colour = "tab:blue" if item.inside else "tab:red"
        ax.plot([item.low, item.high], [0, 0], color=colour, lw=3, solid_capstyle="butt")
        ax.plot([item.estimate], [0], "o", color="k", ms=6)
        ax.set(xlim=(lo, hi), yticks=[], xscale="log" if item.log else "linear")
        ax.set_title(item.label, fontsize=9, loc="left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def _number_after(text: str, pattern: str) -> float:
    found = re.search(pattern + r"\s*([-+]?\d+(?:\.\d+)?)", text)
    if found is None:
        raise ValueError(f"no number after {pattern!r} in {text!r}")
    return float(found.group(1))


def _test_row(folder: Path) -> pd.Series:
    return pd.read_csv(folder / "test.csv").iloc[0]


def lm_small_batch(folder: Path) -> list[Deciding]:
    """Version 2: d_beta2's interval above 0; d_small's upper end at most 1% of L(half-life, 256)."""
    t = _test_row(folder)
    margin = 0.01 * _number_after(str(t["threshold"]), r"0\.01 x")
    return [Deciding(f"{t['statistic 1']} (nats): interval above 0", t["estimate 1"], t["low 1"], t["high 1"],
                     (0.0, INF)),
            Deciding(f"{t['statistic 2']} (nats): upper end <= {margin:.4f}", t["estimate 2"], t["low 2"],
                     t["high 2"], (-INF, margin))]


def lm_batch_warmup(folder: Path) -> list[Deciding]:
    """Version 2: L(warmup) - L(small)'s upper end at most 1% of L(small); L(warmup) - L(large) below 0."""
    t = _test_row(folder)
    margin = 0.01 * _number_after(str(t["threshold"]), r"1% of")
    return [Deciding(f"{t['statistic 1']} (nats): upper end <= {margin:.4f}", t["estimate 1"], t["low 1"],
                     t["high 1"], (-INF, margin)),
            Deciding(f"{t['statistic 2']} (nats): interval below 0", t["estimate 2"], t["low 2"], t["high 2"],
                     (-INF, 0.0))]


def lm_cbs(folder: Path) -> list[Deciding]:
    """Version 2: D (growth of log2 CBS, first to last checkpoint) above 0; G (the last doubling) below 1."""
    t = _test_row(folder)
    return [Deciding(f"{t['statistic']} (octaves): interval above 0", t["estimate"], t["low"], t["high"],
                     (0.0, INF)),
            Deciding(f"{t['second statistic']} (octaves): upper end < 1", t["G"], t["G low"], t["G high"],
                     (-INF, 1.0))]


def noise_mechanism(folder: Path) -> list[Deciding]:
    """Version 4's noise-scale test: r = B_simple / B_crit under each summary, its interval inside [1/10, 10]."""
    table = pd.read_csv(folder / "noise_summaries.csv")
    return [Deciding(f"r under the {r.summary.replace('_', ' ')}: interval inside [0.1, 10]", r.ratio, r.ratio_low,
                     r.ratio_high, (0.1, 10.0), log=True) for r in table.itertuples()]


@dataclass(frozen=True)
class Kind:
    """A kind of report this module reads: its reader, the table it reads, and the interval that table holds."""
    read: Callable[[Path], list[Deciding]]
    table: str
    interval: str


KINDS = {
    "lm_small_batch": Kind(lm_small_batch, "test.csv", "paired t 95% over seeds"),
    "lm_batch_warmup": Kind(lm_batch_warmup, "test.csv", "paired t 95% over seeds"),
    "lm_cbs": Kind(lm_cbs, "test.csv", "t 95% over seeds (on log2 CBS)"),
    "noise_mechanism": Kind(noise_mechanism, "noise_summaries.csv", "seed-bootstrap 95%"),
}


def redraw(kind: str, folder: Path) -> list[Path]:
    """deciding.png/.pdf/.txt in `folder`, from its table read by KINDS[kind]; the title gives the verdict as
    test.csv states it (for a table without one: whether every interval lies in its band), the caption names the
    interval."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; accepted: {', '.join(KINDS)}")
    how = KINDS[kind]
    items = how.read(folder)
    verdict = str(_test_row(folder)["verdict"]) if how.table == "test.csv" else \
        ("every interval inside its band" if all(i.inside for i in items) else "an interval outside its band")
    fig = forest(items, f"{folder.name}: {verdict}")
    caption = (f"The deciding statistics of {folder.name}'s pre-registered test, redrawn from its committed "
               f"{how.table}: each estimate (dot) and its {how.interval} interval (bar: blue inside the shaded band, "
               f"red not); shaded: where the interval must lie for the test's 'reproduced'.")
    paths = save_figure(fig, folder / "deciding", caption)
    plt.close(fig)
    return paths


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] not in KINDS or not Path(argv[1]).is_dir():
        print(f"usage: python -m bsresearch.plots.deciding KIND REPORT_FOLDER (KIND: {', '.join(KINDS)})",
              file=sys.stderr)
        return 2
    print("\n".join(map(str, redraw(argv[0], Path(argv[1])))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
