"""Shared by the benchmark scripts: interleaved repeats, result files named by the machine (device_label)."""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from bsresearch.systems.bench import device_label as machine_label

RESULTS = Path(__file__).resolve().parent / "results"


def interleaved(candidates: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
    """Call each candidate in turn, `repeats` rounds: slow drifts of the machine hit all of them alike."""
    out: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            out[name].append(fn())
    return out


def median_and_spread(values: list[float]) -> tuple[float, float]:
    """Median and half the interquartile range."""
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return statistics.median(values), (q[2] - q[0]) / 2


def time_steps(step: Callable[[], None], n_steps: int, device: torch.device) -> float:
    """Steps per second over n_steps calls, synchronised at both ends."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(n_steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n_steps / (time.perf_counter() - start)


def write_results(df: pd.DataFrame, name: str, device: torch.device, out_dir: str | Path = RESULTS) -> Path:
    """Write df as OUT_DIR/<name>_<machine>.csv with the machine as its first column; print it."""
    label = machine_label(device)
    df.insert(0, "machine", label)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    out = Path(out_dir) / f"{name}_{label}.csv"
    df.to_csv(out, index=False, float_format="%.4g")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"written: {out}")
    return out


def int_list(text: str) -> list[int]:
    """'32,256,4000' as [32, 256, 4000] (an argparse type)."""
    return [int(v) for v in text.split(",")]


def benchmark_parser(doc: str, batch_sizes: str | None = None, seconds: float | None = None,
                     repeats: int | None = None, seconds_help: str = "per timing") -> argparse.ArgumentParser:
    """The options every benchmark takes (--device, --threads, --out-dir) and, with their defaults given, the
    timing ones (--batch-sizes as a list of ints, --seconds, --repeats); each benchmark adds its own."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: the setting of sweeps)")
    parser.add_argument("--out-dir", default=str(RESULTS), help="where the CSV goes")
    if batch_sizes is not None:
        parser.add_argument("--batch-sizes", type=int_list, default=batch_sizes, help=f"[{batch_sizes}]")
    if seconds is not None:
        parser.add_argument("--seconds", type=float, default=seconds, help=seconds_help)
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats)
    return parser


def start(args: argparse.Namespace) -> torch.device:
    """The device the benchmark runs on, with the thread count and the allocator set as a run sets them."""
    from bsresearch.runtime import prepare_process, resolve_device
    prepare_process(args.threads)
    return resolve_device(args.device)
