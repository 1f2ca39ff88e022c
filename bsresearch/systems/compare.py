"""Precision and optimizer side by side: memory and throughput of fp32 / bf16 / fp16, SGD / Adam, one table."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from ..config import ConfigError
from ..runtime import check_precision
from .memory import measure_memory
from .timing import measure_throughput
from .workload import Workload

MEMORY_COLUMNS = ["peak_bytes", "param_bytes", "grad_bytes", "optimizer_bytes", "input_bytes",
                  "activation_bytes", "reserved_bytes", "method"]
THROUGHPUT_COLUMNS = ["examples_per_second", "seconds_per_step", "seconds_q1", "seconds_q3", "steps_per_repeat",
                      "timer"]


def compare_precisions(workload: Workload, batch_sizes: Sequence[int], device: torch.device | str,
                       precisions: Sequence[str] = ("fp32", "bf16", "fp16"),
                       optimizers: Sequence[str] = ("sgd", "adam"), warmup: int = 3, repeats: int = 5,
                       min_seconds: float = 0.05, threads: int | None = 1) -> pd.DataFrame:
    """One row per (precision, optimizer, batch size): training throughput and peak memory.

    A precision the device cannot run (fp16 needs CUDA and a GradScaler; bf16 needs a GPU that supports
    it) gets status 'unsupported' and a note instead of numbers; a step that runs out of memory gets
    status 'oom'. Memory columns are those of measure_memory, throughput columns those of
    measure_throughput (fresh model per measurement, same initial weights).
    """
    device = torch.device(device)
    rows: list[dict[str, Any]] = []
    for precision in precisions:
        for optimizer in optimizers:
            w = workload.replace(precision=precision, optimizer=optimizer)
            base = {"model": w.cfg.model, "precision": precision, "optimizer": optimizer}
            try:
                check_precision(precision, device)
            except ConfigError as exc:
                rows += [{**base, "batch_size": b, "status": "unsupported", "note": str(exc)} for b in batch_sizes]
                continue
            memory = measure_memory(w, batch_sizes, device, stop_at_oom=False).set_index("batch_size")
            speed = measure_throughput(w, batch_sizes, device, warmup=warmup, repeats=repeats,
                                       min_seconds=min_seconds, threads=threads, stop_at_oom=False)
            speed = speed.set_index("batch_size")
            for b in sorted(set(batch_sizes)):
                ok = memory.loc[b, "status"] == "ok" and speed.loc[b, "status"] == "ok"
                row = {**base, "batch_size": b, "status": "ok" if ok else "oom", "note": ""}
                row.update({c: memory.loc[b, c] for c in MEMORY_COLUMNS if c in memory})
                row.update({c: speed.loc[b, c] for c in THROUGHPUT_COLUMNS if c in speed})
                rows.append(row)
    return pd.DataFrame(rows)
