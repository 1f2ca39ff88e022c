"""The advice figure: examples/s, statistical efficiency, their product, and peak memory with the
out-of-memory line, the recommended batch size marked on each (plots.systems draws the panels). On several
devices the batch sizes are global; memory and examples/s are one device's (its share), and the out-of-memory
line is at the largest global batch without accumulation."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ..plots.systems import memory_plot, recommendation_plots
from .api import Advice


def advice_figure(advice: Advice) -> plt.Figure:
    """Four panels side by side from advice.table; batch sizes on a log-2 axis."""
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    ok = advice.table[advice.table["status"] == "ok"]
    recommendation_plots(axes[:3], ok.assign(b_simple=advice.b_simple), advice.batch_size)
    label = "peak memory" if advice.devices == 1 else "peak memory of one device"
    table = advice.table.assign(config=label)
    largest = advice.largest_global_batch_size
    summary = pd.DataFrame([{"config": label, "largest_batch": largest,
                             "search_reached_limit": advice.search.reached_limit}])
    memory_plot(axes[3], table, hue="config", memory_budget=advice.memory_budget, summary=summary)
    memory = axes[3]
    if not advice.search.reached_limit:
        memory.annotate(f"largest that fits: {largest}", (largest, 0.5),
                        xycoords=memory.get_xaxis_transform(), ha="right", va="center", rotation=90, fontsize=7)
    accumulated = advice.table[advice.table["accumulation_steps"] > 1]
    if len(accumulated):
        memory.text(0.98, 0.03, "beyond the dashed line:\nthe accumulation micro-batch",
                    transform=memory.transAxes, fontsize=7, ha="right", va="bottom")
    memory.axvline(advice.batch_size, color="tab:red", linestyle="--", linewidth=1)
    plan = "" if advice.accumulation_steps == 1 else f" = {advice.accumulation_steps} x {advice.micro_batch_size}"
    on = "" if advice.devices == 1 else (f" on {advice.devices} devices ({advice.per_device_batch} per device; "
                                          f"one device measured)")
    fig.suptitle(f"recommended batch {advice.batch_size}{plan}{on}, lr {advice.lr:.3g} ({advice.lr_rule}); "
                 f"B_simple {advice.b_simple:.3g} ({advice.noise_method}); {advice.device}", fontsize=10)
    fig.tight_layout()
    return fig
