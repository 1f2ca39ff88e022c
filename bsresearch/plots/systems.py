"""Systems figures: throughput and memory vs batch size with the out-of-memory boundary, and the
batch-size recommendation (examples/second, statistical efficiency, their product).

Every function draws onto a given Axes from a DataFrame made by bsresearch.systems (no torch import).
Tables: `table` has one row per (model, precision, optimizer, batch_size[, mode]) with columns
examples_per_second, seconds_q1/q3, peak_bytes and its parts, status / memory_status ('ok', 'oom', ...);
`summary` one row per workload with largest_batch (from the search) when one was made.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ..sizes import byte_unit
from . import log2_batch_axis

PARTS = [("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optimizer_bytes", "optimizer state"),
         ("input_bytes", "inputs"), ("activation_bytes", "activations"), ("other_bytes", "other")]


def _colors(values: Sequence) -> dict:
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {v: cycle[i % len(cycle)] for i, v in enumerate(dict.fromkeys(values))}


def _ok(table: pd.DataFrame, column: str = "status") -> pd.DataFrame:
    return table[table[column] == "ok"] if column in table else table


def mark_oom(ax: plt.Axes, table: pd.DataFrame, hue: str, colors: dict, summary: pd.DataFrame | None = None,
             status: str = "memory_status", note_limit: bool = True) -> None:
    """Mark the out-of-memory boundary of each hue group: an x at the bottom of the axes at the first batch
    size that ran out of memory, and a dashed vertical line at the largest batch the search found (or,
    with note_limit, a note when the search reached its limit without running out)."""
    column = status if status in table else "status"
    for value, group in table.groupby(hue, sort=False):
        failed = group[group[column] == "oom"]
        if len(failed):
            b = failed["batch_size"].min()
            ax.plot([b], [0.02], marker="x", markersize=9, mew=2, color=colors[value],
                    transform=ax.get_xaxis_transform(), clip_on=False, linestyle="none")
            ax.annotate("OOM", (b, 0.05), xycoords=ax.get_xaxis_transform(), ha="center", fontsize=7,
                        color=colors[value])
        if summary is not None and "largest_batch" in summary and hue in summary:
            found = summary[summary[hue] == value]
            for _, row in found.dropna(subset=["largest_batch"]).iterrows():
                if row.get("search_reached_limit", False):
                    if not note_limit:
                        continue
                    k = list(colors).index(value)
                    ax.text(0.98, 0.03 + 0.06 * k, f"{value}: no OOM up to {int(row['largest_batch'])}",
                            transform=ax.transAxes, ha="right", fontsize=7, color=colors[value])
                elif row["largest_batch"] > 0:
                    ax.axvline(row["largest_batch"], color=colors[value], linestyle="--", linewidth=1, alpha=0.8)


def _nothing_ran(ax: plt.Axes) -> None:
    ax.text(0.5, 0.5, "no batch size fitted", transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks([])
    ax.set_yticks([])


def _plain_log_y(ax: plt.Axes) -> None:
    """Log y axis with plain-number labels (1000, not 10^3) and no minor labels."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def throughput_plot(ax: plt.Axes, table: pd.DataFrame, hue: str = "precision", mode: str = "train",
                    summary: pd.DataFrame | None = None) -> None:
    """Examples per second (median over repeats, bars: quartiles) vs batch size, one line per `hue` value;
    log-2 batch axis, log examples/s axis; OOM boundary marked."""
    rows = table[table["mode"] == mode] if "mode" in table else table
    colors = _colors(table[hue])
    if _ok(rows).empty:
        _nothing_ran(ax)
        return
    for value, group in _ok(rows).groupby(hue, sort=False):
        group = group.sort_values("batch_size")
        eps = group["examples_per_second"]
        yerr = None
        if "seconds_q1" in group and "seconds_q3" in group:  # the interquartile range of the step time
            lower = eps - group["batch_size"] / group["seconds_q3"]
            upper = group["batch_size"] / group["seconds_q1"] - eps
            yerr = [lower.clip(lower=0), upper.clip(lower=0)]
        ax.errorbar(group["batch_size"], eps, yerr=yerr, marker="o", markersize=3, capsize=2, color=colors[value],
                    label=str(value))
    mark_oom(ax, table, hue, colors, summary)
    log2_batch_axis(ax, "x", _ticks(table))
    _plain_log_y(ax)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"{mode} examples / second")
    ax.legend(fontsize=8, title=hue, title_fontsize=8)


def memory_plot(ax: plt.Axes, table: pd.DataFrame, hue: str = "precision", memory_budget: float | None = None,
                summary: pd.DataFrame | None = None, fits: dict | None = None) -> None:
    """Peak memory vs batch size (in GiB, MiB or KiB as fits), one line per `hue` value; optional fitted lines
    (hue value -> (fixed_bytes, per_example_bytes)), the memory budget, and the OOM boundary."""
    rows = table[table["mode"] == "train"] if "mode" in table else table
    colors = _colors(table[hue])
    if _ok(rows, "memory_status" if "memory_status" in rows else "status").empty:
        _nothing_ran(ax)
        return
    divisor, unit = byte_unit(max(rows["peak_bytes"].max(skipna=True) if "peak_bytes" in rows else 0,
                                   memory_budget or 0))
    for value, group in _ok(rows, "memory_status" if "memory_status" in rows else "status").groupby(hue, sort=False):
        group = group.sort_values("batch_size").drop_duplicates("batch_size")
        ax.plot(group["batch_size"], group["peak_bytes"] / divisor, marker="o", markersize=3, color=colors[value],
                label=str(value))
        if fits and value in fits:
            fixed, per_example = fits[value]
            xs = [group["batch_size"].min(), group["batch_size"].max()]
            ax.plot(xs, [(fixed + per_example * b) / divisor for b in xs], color=colors[value], linestyle=":",
                    linewidth=1)
    if memory_budget:
        ax.axhline(memory_budget / divisor, color="black", linestyle="-.", linewidth=1, label="budget")
    mark_oom(ax, table, hue, colors, summary, note_limit=False)
    log2_batch_axis(ax, "x", _ticks(table))
    _plain_log_y(ax)
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.legend(fontsize=8, title=hue, title_fontsize=8)


def memory_breakdown_plot(ax: plt.Axes, table: pd.DataFrame) -> None:
    """Stacked peak memory of one workload (in GiB, MiB or KiB as the largest stack fits): parameters,
    gradients, optimizer state, inputs, activations."""
    rows = _ok(table, "memory_status" if "memory_status" in table else "status")
    rows = rows.sort_values("batch_size").drop_duplicates("batch_size")
    present = [(c, name) for c, name in PARTS if c in rows and rows[c].fillna(0).sum() > 0]
    total = sum((rows[c].fillna(0) for c, _ in present), pd.Series(0.0, index=rows.index))
    divisor, unit = byte_unit(total.max() if len(total) else 0)
    ax.stackplot(rows["batch_size"], *[rows[c].fillna(0) / divisor for c, _ in present],
                 labels=[name for _, name in present], alpha=0.85)
    log2_batch_axis(ax, "x", _ticks(rows))
    ax.set_xlabel("batch size")
    ax.set_ylabel(f"memory at the peak ({unit})")
    ax.legend(fontsize=8, loc="upper left")


def precision_plot(ax: plt.Axes, table: pd.DataFrame, batch_size: int | None = None) -> None:
    """Bars of examples/s and peak memory for each (precision, optimizer) at one batch size (the largest
    measured by default), from compare_precisions; unsupported combinations are labelled."""
    b = batch_size or table["batch_size"].max()
    rows = table[table["batch_size"] == b].reset_index(drop=True)
    labels = [f"{p}\n{o}" for p, o in zip(rows["precision"], rows["optimizer"])]
    speed = rows["examples_per_second"].fillna(0) if "examples_per_second" in rows else [0] * len(rows)
    ax.bar(range(len(rows)), speed, color="tab:blue", label="examples / s")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("examples / second")
    if "peak_bytes" in rows:
        twin = ax.twinx()
        divisor, unit = byte_unit(rows["peak_bytes"].max(skipna=True) if rows["peak_bytes"].notna().any() else 0)
        twin.plot(range(len(rows)), rows["peak_bytes"] / divisor, "D", color="tab:red", label="peak memory")
        twin.set_ylabel(f"peak memory ({unit})", color="tab:red")
    for i, status in enumerate(rows["status"]):
        if status != "ok":
            ax.annotate(status, (i, 0), ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_title(f"batch size {b}", fontsize=9)


def recommendation_plots(axes: Sequence[plt.Axes], table: pd.DataFrame, batch_size: int | None = None) -> None:
    """Three panels from recommend.time_to_target's table: examples/second, statistical efficiency
    1 / (1 + B / B_simple), and their product (progress per second, which the recommended batch size
    maximises: it minimises the predicted time to the target). The recommended size is marked."""
    t = table.sort_values("batch_size")
    panels = [("examples_per_second", "examples / second", "log"),
              ("statistical_efficiency", "statistical efficiency  E_min / E", "linear"),
              ("effective_examples_per_second", "examples/s x efficiency  (~ 1 / time)", "log")]
    b_simple = float(t["b_simple"].iloc[0]) if "b_simple" in t else math.nan
    for ax, (column, label, scale) in zip(axes, panels):
        ax.plot(t["batch_size"], t[column], marker="o", markersize=3)
        if batch_size:
            ax.axvline(batch_size, color="tab:red", linestyle="--", linewidth=1, label=f"recommended {batch_size}")
        if column == "statistical_efficiency" and math.isfinite(b_simple):
            ax.axvline(b_simple, color="grey", linestyle=":", linewidth=1, label=f"B_simple {b_simple:.3g}")
        log2_batch_axis(ax, "x", _ticks(t))
        if scale == "log":
            _plain_log_y(ax)
        ax.set_xlabel("batch size")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)


def bench_figure(table: pd.DataFrame, summary: pd.DataFrame | None = None,
                 memory_budget: float | None = None) -> plt.Figure:
    """The benchmark figure: a column per model, throughput on top and peak memory below, a line per precision
    (and optimizer when several), with the out-of-memory boundary marked."""
    table = table.copy()
    several = table["optimizer"].nunique() > 1
    table["config"] = table["precision"] + (" " + table["optimizer"] if several else "")
    if summary is not None and len(summary):
        summary = summary.copy()
        summary["config"] = summary["precision"] + (" " + summary["optimizer"] if several else "")
    models = list(dict.fromkeys(table["model"]))
    fig, axes = plt.subplots(2, len(models), figsize=(4.2 * len(models), 7), squeeze=False)
    for j, model in enumerate(models):
        rows = table[table["model"] == model]
        rows_summary = summary[summary["model"] == model] if summary is not None and len(summary) else None
        throughput_plot(axes[0, j], rows, hue="config", summary=rows_summary)
        memory_plot(axes[1, j], rows, hue="config", memory_budget=memory_budget, summary=rows_summary)
        axes[0, j].set_title(f"{model} ({rows['dataset'].iloc[0]})" if "dataset" in rows else model)
    fig.tight_layout()
    return fig


def _ticks(table: pd.DataFrame) -> list[int] | None:
    """Every batch size when there are few, else every other power of two."""
    sizes = sorted(set(int(b) for b in table["batch_size"]))
    if len(sizes) <= 8:
        return sizes
    return sizes[::2]
