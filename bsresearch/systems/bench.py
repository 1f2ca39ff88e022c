"""The systems benchmark: throughput, memory, the out-of-memory boundary and FLOP/s for several workloads.

`run_bench` measures each workload over batch sizes (memory, then throughput over the sizes that fit),
searches for the largest batch that fits, and counts FLOPs per step; `write_bench` saves the table, the
per-workload summary and the figure, named with the device (the GPU model). `bsresearch bench` and
benchmarks/systems_gpu.py are thin wrappers around these two.

On several devices (`devices`: a run of RunConfig.devices processes, data-parallel) every measurement is
still made on one device: each device holds the same share of a batch, so what one device holds is what each
holds, and an out-of-memory error on one device is one of the run. The summary adds the global view: the
largest global batch without accumulation (largest_batch_on_devices: the per-device largest times the
devices) and, for a target global batch, the accumulation plan whose per-device micro-batch fits one device
(plan.accumulation_plan). Throughput and FLOP/s stay one device's: N devices are not timed here, and no
N-device throughput is derived from them.
"""
from __future__ import annotations

import functools
import os
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ..config import ConfigError
from ..runtime import device_name
from ..source import git_commit
from .fit import MemoryFit, fit_memory_table
from .flops import Tf32, count_step_flops, step_peak, tf32_settings
from .memory import measure_memory
from .plan import accumulation_plan, check_shares, largest_batch_on_devices
from .presets import Preset
from .search import BatchSearch, largest_batch_size
from .timing import measure_throughput, torch_threads
from .workload import Workload, build_parts, free_memory, model_workload


@dataclass(frozen=True, eq=False)
class BenchResult:
    """Everything one benchmark measured."""
    table: pd.DataFrame       # one row per (model, precision, optimizer, batch size): memory, throughput, FLOP/s
    summary: pd.DataFrame     # one row per workload: largest batch (per device, and global on `devices`),
                              # memory fit, FLOP/s at the largest batch, the plan for a target global batch
    searches: dict[str, BatchSearch] = field(default_factory=dict)   # workload label -> search
    fits: dict[str, MemoryFit] = field(default_factory=dict)         # workload label -> memory fit
    device: str = "cpu"
    device_name: str = ""
    settings: dict = field(default_factory=dict)


def run_bench(workloads: Sequence[Workload], batch_sizes: Sequence[int], device: torch.device | str,
              memory_budget: int | None = None, search: bool = True, search_limit: int = 2 ** 20,
              warmup: int = 3, repeats: int = 5, min_seconds: float = 0.05, threads: int | None = 1,
              inference: bool = False, devices: int = 1, target_batch_size: int | None = None,
              log: Callable[[str], None] | None = None) -> BenchResult:
    """Measure every workload over `batch_sizes` (ascending) on `device`.

    Per workload: peak memory per batch size until the first out-of-memory (on CUDA under a cap of
    memory_budget bytes when given; on the CPU 'out of memory' means over memory_budget by the accounted
    peak); the linear memory fit; the largest batch that fits (search, from the smallest batch size up
    to search_limit; on the CPU only with a memory_budget, through the fit); training throughput (and
    inference throughput with `inference`) over the sizes that fit; FLOPs per step counted on the meta
    device; achieved FLOP/s and its fraction of the GPU's dense peak when the GPU is in flops.GPU_PEAKS.
    The search's safe batch keeps a 10% margin, rounded down to a multiple of 8. An error other than running
    out of memory ends that workload's sweep with status 'error' (and its message) instead of losing the rest
    of the benchmark.

    `devices`: the number of devices a run would train on (RunConfig.devices). The search stays a search on
    one device, for the largest per-device batch (every device holds the same share, so measuring one is
    enough); the summary adds `devices`, `largest_global_batch` = largest_batch x devices (the largest global
    batch without accumulation) and `safe_global_batch` = safe_batch x devices. `target_batch_size`: a global
    batch to plan for: the summary's target_* columns are its accumulation plan on `devices` devices (each
    device's micro-batch at most the safe per-device batch, or the search limit when nothing failed below it).
    A target that does not split into `devices` equal shares is a ConfigError before any work. Batch sizes,
    throughput and FLOP/s in the table are one device's: the devices together are not timed.
    """
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ConfigError(f"devices must be a positive integer (1, 2, ...); got {devices!r}")
    if target_batch_size is not None:
        if target_batch_size < 1:
            raise ConfigError(f"target_batch_size must be a positive integer; got {target_batch_size!r}")
        check_shares(target_batch_size, devices, "target_batch_size")
    device = torch.device(device)
    say = log or (lambda message: None)
    sizes = sorted(set(batch_sizes))
    name = device_name(device)
    tf32 = tf32_settings()
    tables, summaries, searches, fits = [], [], {}, {}
    with torch_threads(threads if device.type == "cpu" else None):
        for w in workloads:
            say(f"{w.label}: memory")
            memory = _sweep(functools.partial(_memory_at, w, device, memory_budget), sizes)
            fit = None
            if (memory["status"] == "ok").sum() >= 2:
                fit = fits[w.label] = fit_memory_table(memory)
            found, search_error = None, None
            if search and (device.type == "cuda" or memory_budget is not None):
                say(f"{w.label}: largest batch search")
                try:
                    parts = build_parts(w, device)
                    found = searches[w.label] = largest_batch_size(parts, w, memory_budget, start=sizes[0],
                                                                   limit=max(search_limit, sizes[0]), fit=fit,
                                                                   safety_margin=0.1, multiple_of=8)
                except Exception as exc:  # noqa: BLE001 - e.g. a kernel's size limit: keep the sweeps
                    search_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                parts = None
                free_memory(device)
            fitting = [b for b, s in zip(memory["batch_size"], memory["status"]) if s == "ok"]
            say(f"{w.label}: throughput at {len(fitting)} batch sizes")
            modes = ["train", "inference"] if inference else ["train"]
            speed = pd.concat([_sweep(functools.partial(_throughput_at, w, device, m, warmup, repeats, min_seconds),
                                      fitting) for m in modes], ignore_index=True)
            table = _merge(memory, speed, w, device, name, tf32)
            tables.append(table)
            summaries.append({**_summary(w, table, fit, found, memory_budget, name),
                              **_on_devices(found, devices, target_batch_size), "search_error": search_error})
    settings = {"warmup": warmup, "repeats": repeats, "min_seconds": min_seconds, "threads": threads,
                "memory_budget": memory_budget, "search_limit": search_limit, "batch_sizes": sizes,
                "devices": devices, "target_batch_size": target_batch_size}
    return BenchResult(pd.concat(tables, ignore_index=True), pd.DataFrame(summaries), searches, fits,
                       str(device), name, settings)


def _memory_at(workload: Workload, device: torch.device, memory_budget: int | None, batch_size: int) -> pd.DataFrame:
    return measure_memory(workload, [batch_size], device, memory_budget)


def _throughput_at(workload: Workload, device: torch.device, mode: str, warmup: int, repeats: int,
                   min_seconds: float, batch_size: int) -> pd.DataFrame:
    return measure_throughput(workload, [batch_size], device, mode=mode, warmup=warmup, repeats=repeats,
                              min_seconds=min_seconds, threads=None)


def _sweep(measure: Callable[[int], pd.DataFrame], sizes: Sequence[int]) -> pd.DataFrame:
    """measure(b) for each size in turn, stopping after the first 'oom' or error (recorded as a row)."""
    frames = []
    for b in sizes:
        try:
            frame = measure(b)
        except Exception as exc:  # noqa: BLE001 - not an OOM: record it, keep what was measured
            frame = pd.DataFrame([{"batch_size": b, "status": "error",
                                   "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                                   "traceback": traceback.format_exc(limit=4)}])
        frames.append(frame)
        if (frame["status"] != "ok").any():
            break
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["batch_size", "status"])


def _merge(memory: pd.DataFrame, speed: pd.DataFrame, w: Workload, device: torch.device, name: str,
           tf32: Tf32) -> pd.DataFrame:
    """One row per batch size and mode: memory columns, throughput columns, FLOPs and FLOP/s."""
    memory = memory.rename(columns={"status": "memory_status", "method": "memory_method",
                                    "error": "memory_error"}).drop(columns=["traceback"], errors="ignore")
    memory = memory.drop(columns=[c for c in ("model", "precision", "optimizer", "device") if c in memory])
    speed = speed.drop(columns=[c for c in ("model", "precision", "optimizer", "traceback") if c in speed])
    speed = speed.rename(columns={"status": "speed_status", "error": "speed_error"})
    if speed.empty:
        speed = pd.DataFrame({"batch_size": pd.Series(dtype=int), "mode": pd.Series(dtype=str)})
    table = memory.merge(speed, on="batch_size", how="left")
    table["mode"] = table["mode"].fillna("train")
    speed_status = table["speed_status"] if "speed_status" in table else [None] * len(table)
    table["status"] = [_status(m, s) for m, s in zip(table["memory_status"], speed_status)]
    table.insert(0, "model", w.cfg.model)
    table.insert(1, "dataset", w.cfg.dataset)
    table.insert(2, "precision", w.cfg.precision)
    table.insert(3, "optimizer", w.cfg.optimizer)
    parts = build_parts(w.replace(precision="fp32"), "cpu")  # FLOPs depend on shapes only
    table["parameters"] = sum(p.numel() for p in parts.model.parameters())
    flops = [count_step_flops(parts.model, w.input_shape, w.num_classes, int(b), backward=m == "train",
                              example=w.examples, loss_fn=w.loss) for b, m in zip(table["batch_size"], table["mode"])]
    table["flops_per_step"] = [f.total for f in flops]
    table["achieved_flops_per_second"] = table["flops_per_step"] / table.get("seconds_per_step", float("nan"))
    peaks = [step_peak(name, w.cfg.precision, f, tf32) if device.type == "cuda" else (None, None) for f in flops]
    table["peak_dtype"] = [dtype for dtype, _ in peaks]
    table["peak_flops_per_second"] = [peak for _, peak in peaks]
    table["fraction_of_peak"] = table["achieved_flops_per_second"] / table["peak_flops_per_second"].astype(float)
    table["device"], table["device_name"] = str(device), name
    return table


def _status(memory_status: str, speed_status: object) -> str:
    if memory_status != "ok":
        return memory_status
    return speed_status if isinstance(speed_status, str) else "not_timed"


def _summary(w: Workload, table: pd.DataFrame, fit: MemoryFit | None, found: BatchSearch | None,
             memory_budget: int | None, name: str) -> dict:
    """One workload's headline numbers; FLOP/s at the largest batch size that was timed."""
    train = table[(table["mode"] == "train") & (table["status"] == "ok")]
    failed = table[table["memory_status"] != "ok"]
    last = train.iloc[-1] if len(train) else None
    row = {"model": w.cfg.model, "dataset": w.cfg.dataset, "precision": w.cfg.precision,
           "optimizer": w.cfg.optimizer, "parameters": int(table["parameters"].iloc[0]),
           "largest_timed_batch": int(last["batch_size"]) if last is not None else None,
           "examples_per_second": float(last["examples_per_second"]) if last is not None else None,
           "flops_per_step": int(last["flops_per_step"]) if last is not None else None,
           "achieved_tflops": float(last["achieved_flops_per_second"]) / 1e12 if last is not None else None,
           "peak_dtype": last["peak_dtype"] if last is not None else None,
           "peak_tflops": float(last["peak_flops_per_second"]) / 1e12
           if last is not None and pd.notna(last["peak_flops_per_second"]) else None,
           "fraction_of_peak": float(last["fraction_of_peak"])
           if last is not None and pd.notna(last["fraction_of_peak"]) else None,
           "first_failed_batch": int(failed["batch_size"].iloc[0]) if len(failed) else None,
           "first_failure": failed["memory_status"].iloc[0] if len(failed) else None,
           "memory_budget": memory_budget, "device_name": name}
    if fit is not None:
        row.update(fit_fixed_bytes=fit.fixed_bytes, fit_per_example_bytes=fit.per_example_bytes,
                   fit_rms_residual_bytes=fit.rms_residual_bytes,
                   fit_largest_for_budget=fit.largest_batch(memory_budget) if memory_budget else None)
    if found is not None:
        row.update(largest_batch=found.largest_batch_size, safe_batch=found.safe_batch_size,
                   search_first_oom=found.first_failure, search_reached_limit=found.reached_limit,
                   search_trials=len(found.tried))
    return row


def _on_devices(found: BatchSearch | None, devices: int, target_batch_size: int | None) -> dict:
    """The global view of one workload's search on `devices` devices: the largest global batch without
    accumulation, and the accumulation plan of the target global batch (None where no search ran)."""
    row: dict = {"devices": devices}
    if found is not None:
        row.update(largest_global_batch=largest_batch_on_devices(found.largest_batch_size, devices),
                   safe_global_batch=largest_batch_on_devices(found.safe_batch_size, devices))
    if target_batch_size is not None:
        plan = None
        if found is not None:
            # per device: the safe batch, or the limit itself when nothing failed up to it (as advise plans)
            limit = found.largest_batch_size if found.reached_limit else found.safe_batch_size
            if limit >= 1:
                plan = accumulation_plan(target_batch_size, limit, devices)
        row.update(target_batch_size=target_batch_size,
                   target_micro_batch_size=plan.micro_batch_size if plan else None,
                   target_accumulation_steps=plan.accumulation_steps if plan else None,
                   target_per_device_batch=plan.per_device_batch if plan else None)
    return row


# ----------------------------------------------------------------------------- presets and files
def preset_workloads(preset: Preset, optimizer: str | None = None) -> list[Workload]:
    return [model_workload(m, precision=p, optimizer=optimizer or preset.optimizer)
            for m in preset.models for p in preset.precisions]


def device_label(device: torch.device | str) -> str:
    """Filename-safe machine name: the GPU model ('nvidia-h100-80gb-hbm3') or 'cpu-<model>-<N>cores'."""
    device = torch.device(device)
    name = device_name(device) if device.type == "cuda" else f"cpu {device_name(device)} {os.cpu_count()}cores"
    return re.sub(r"[^A-Za-z0-9]+", "-", name.strip()).strip("-").lower()


def write_bench(result: BenchResult, out_dir: str | Path, stem: str = "systems", label: str | None = None,
                figure: bool = True) -> list[Path]:
    """Write <stem>_<label>.csv (the table), <stem>_summary_<label>.csv and the figure
    <stem>_<label>.png/.pdf/.txt; the label defaults to the device's (the GPU model)."""
    from ..plots import save_figure
    from ..plots.systems import bench_figure
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    label = label or device_label(result.device)
    paths = [out / f"{stem}_{label}.csv", out / f"{stem}_summary_{label}.csv"]
    result.table.to_csv(paths[0], index=False, float_format="%.6g")
    result.summary.to_csv(paths[1], index=False, float_format="%.6g")
    if figure:
        import matplotlib.pyplot as plt
        fig = bench_figure(result.table, result.summary, result.settings.get("memory_budget"))
        caption = (f"Training throughput and peak memory vs batch size on {result.device_name} ({result.device}); "
                   f"x marks the first batch size that ran out of memory, the dashed line the largest batch "
                   f"found by search. Synthetic inputs (or the first examples of the user's data, cycled), one "
                   f"fixed batch per size, median of "
                   f"{result.settings.get('repeats')} repeats after {result.settings.get('warmup')} warm-up "
                   f"steps. bsresearch commit {git_commit()}, torch {torch.__version__}, "
                   f"{time.strftime('%Y-%m-%d')}.")
        paths += save_figure(fig, out / f"{stem}_{label}", caption)
        plt.close(fig)
    return paths
