"""What keeping freed memory in the process (runtime.retain_freed_memory) gains for the CPU training step.

A training step frees its activations and gradients and the next step allocates them again. With glibc's
default settings the larger of those blocks go back to the kernel and come back as fresh pages, each one
a page fault; runs (train.run, the fused trainer) and the benchmarks set the allocator to keep them.

This benchmark times the step a run executes (bsresearch.engine.train_next_batch on a TrainState from
state.new_state, one torch thread) in pairs of fresh processes, one with glibc's defaults and one with
retain_freed_memory, their order alternating from pair to pair, so that a drift of a shared machine hits
both sides alike. Each process times every case (model at batch size), the best of three timings of
--seconds each, and counts its minor page faults. The CSV has one row per process and case; the printed
summary gives, per case, the median over pairs of (default step time / retained step time) and the range.

    python benchmarks/allocator.py [--pairs 6] [--cases cnn1d:256,cnn1d:4000,mlp:256,mlp:4000] [--seconds 1]
"""
from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import benchmark_parser, time_steps, write_results  # noqa: E402

from bsresearch.runtime import cpu_name  # noqa: E402

SETTINGS = ("default", "retained")


def child(setting: str, cases: list[tuple[str, int]], seconds: float, threads: int) -> dict[str, dict[str, float]]:
    """Per case: the best step time (ms) of three timings and the minor page faults while timing."""
    from bsresearch.config import RunConfig
    from bsresearch.data import dataset_for
    from bsresearch.engine import train_next_batch
    from bsresearch.runtime import retain_freed_memory, set_threads
    from bsresearch.schedule import scaled_lr
    from bsresearch.state import new_state

    set_threads(threads)
    if setting == "retained" and not retain_freed_memory():
        raise SystemExit("retain_freed_memory does not apply here (it needs Linux with glibc)")
    device = torch.device("cpu")
    out = {}
    for model, batch_size in cases:
        cfg = RunConfig(model=model, dataset="mnist1d", batch_size=batch_size, base_batch_size=batch_size)
        data = dataset_for(cfg, device)
        state = new_state(cfg, data, device)
        step = functools.partial(train_next_batch, state, cfg, data, scaled_lr(cfg))
        time_steps(step, 3, device)   # warm up
        n = max(3, int(time_steps(step, 3, device) * seconds))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        best = min(1e3 / time_steps(step, n, device) for _ in range(3))
        out[f"{model}:{batch_size}"] = {"step_ms": best, "steps_timed": n,
                                        "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults}
    return out


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--cases", default="cnn1d:256,cnn1d:4000,mlp:256,mlp:4000", help="model:batch, ...")
    parser.add_argument("--seconds", type=float, default=1.0, help="per timing")
    parser.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        cases = [(m, int(b)) for m, b in (c.split(":") for c in args.cases.split(","))]
    except ValueError:
        parser.error(f"--cases takes model:batch pairs separated by commas (cnn1d:256,mlp:4000); got {args.cases!r}")
    if args.child:
        print(json.dumps(child(args.child, cases, args.seconds, args.threads)))
        return
    began = time.perf_counter()
    rows = []
    for pair in range(args.pairs):
        order = SETTINGS if pair % 2 == 0 else SETTINGS[::-1]
        for setting in order:
            proc = subprocess.run([sys.executable, __file__, "--child", setting, "--cases", args.cases, "--seconds",
                                   str(args.seconds), "--threads", str(args.threads)],
                                  capture_output=True, text=True, check=True)
            for case, values in json.loads(proc.stdout.splitlines()[-1]).items():
                rows.append({"pair": pair, "setting": setting, "case": case, **values})
        print(f"pair {pair + 1} of {args.pairs} done", flush=True)
    df = pd.DataFrame(rows)
    df["cpu"] = cpu_name()
    for case, group in df.groupby("case", sort=False):
        times = group.pivot(index="pair", columns="setting", values="step_ms")
        ratios = times["default"] / times["retained"]
        faults = group.groupby("setting")["minor_faults"].median()
        print(f"{case}: default / retained step time, median over {len(ratios)} pairs {statistics.median(ratios):.2f}x "
              f"(range {ratios.min():.2f}-{ratios.max():.2f}); step {times['default'].median():.2f} ms -> "
              f"{times['retained'].median():.2f} ms; page faults while timing {faults['default']:.0f} -> "
              f"{faults['retained']:.0f}")
    print(f"{time.perf_counter() - began:.0f} s in all")
    write_results(df, "allocator", torch.device("cpu"), args.out_dir)


if __name__ == "__main__":
    main()
