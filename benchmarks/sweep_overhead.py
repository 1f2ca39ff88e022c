"""What running a sweep through papermill costs, and what a second worker buys.

1. Per-run overhead. The same short run (MNIST-1D CNN, `--steps` steps) is executed, in alternation,
   a) inline: `train.run` in this process (torch already imported) -- the inline executor;
   b) library: one worker process per run calling `train.run`, forked from the sweep's fork server, which has
      imported torch (bsresearch/sweep/forkserver.py);
   b') library, fresh process: the same, but the worker started as `python -m bsresearch.sweep` (process start
      + imports), as every worker was before the fork server and as a GPU sweep's still are;
   c) papermill: one worker process per run executing notebooks/01_train.ipynb (+ kernel start, the
      notebook's imports and its plot) -- the local executor's default.
   overhead(papermill) = median(c) - median(a); (b) - (a) is the part a plain worker process costs. As the
   training itself drifts by seconds on a shared machine, each run also gives the time spent outside its own
   training and evaluation (the wall time around it minus the wall_seconds its metrics record):
   outside_run_s, the start-up and shut-down cost measured within each run, whatever the drift.
2. Workers. A sweep of `--runs` such runs through papermill, each alone (`--fuse off`), with 1 worker and
   with 2, alternated `--repeats` times, fresh run directories each time: speed-up = median(1 worker) /
   median(2 workers).
Run it on a quiet machine; nothing else should compete for the cores.

    python benchmarks/sweep_overhead.py                     # full: about 5 minutes on 2 cores
    python benchmarks/sweep_overhead.py --tiny              # a check that it runs (seconds)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine_label, median_and_spread  # noqa: E402

from bsresearch.config import RunConfig  # noqa: E402
from bsresearch.rundir import RunDir  # noqa: E402
from bsresearch.sweep import RunTask, execute_task, forkserver, parse_spec, run_sweep, run_task  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "notebooks" / "01_train.ipynb"
FRESH = "library, fresh process"


def run_config(steps: int, seed: int = 0) -> RunConfig:
    return RunConfig(dataset="mnist1d", model="cnn1d", optimizer="adam", lr=1e-3, batch_size=32, budget="steps",
                     budget_amount=steps, eval_schedule="every", eval_every=max(1, steps // 4), device="cpu",
                     threads=1, seed=seed, save_checkpoint=False)


def one_run(way: str, cfg: RunConfig, scratch: Path) -> tuple[float, float]:
    """Wall seconds for one run done `way` (inline | library | library, fresh process | papermill), in a fresh
    run directory, and the part of them outside the run's own wall time (metrics.json's wall_seconds)."""
    run_dir = Path(tempfile.mkdtemp(dir=scratch))
    task = RunTask(run_dir=str(run_dir), config=cfg.to_dict(), label=way, notebook=str(TEMPLATE),
                   engine="papermill" if way == "papermill" else "library", timeout=600)
    fresh = way == FRESH
    if fresh:
        os.environ[forkserver.SWITCH] = "0"
    try:
        start = time.perf_counter()
        outcome = execute_task(task) if way == "inline" else run_task(task)
        seconds = time.perf_counter() - start
    finally:
        if fresh:
            del os.environ[forkserver.SWITCH]
    if outcome.state != "ok":
        raise RuntimeError(f"{way} run ended {outcome.state}: {outcome.error}")
    return seconds, seconds - float(RunDir(run_dir).metrics()["wall_seconds"])


def per_run_overhead(steps: int, repeats: int, scratch: Path) -> list[dict]:
    ways = ("inline", "library", FRESH, "papermill")
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    outside: dict[str, list[float]] = {w: [] for w in ways}
    one_run("inline", run_config(steps), scratch)  # warm: dataset cache, imports of this process
    one_run("library", run_config(steps), scratch)  # warm: the fork server's start and imports, paid once a sweep
    for r in range(repeats):
        for way in ways if r % 2 == 0 else ways[::-1]:  # alternate the order: drifts hit all alike
            total, beyond = one_run(way, run_config(steps, seed=r), scratch)
            seconds[way].append(total)
            outside[way].append(beyond)
    base = statistics.median(seconds["inline"])
    rows = []
    for way in ways:
        med, spread = median_and_spread(seconds[way])
        rows.append({"measure": "per_run_seconds", "variant": way, "median": med, "spread": spread,
                     "overhead_vs_inline_s": med - base, "ratio_vs_inline": med / base,
                     "outside_run_s": statistics.median(outside[way]), "n": len(seconds[way]),
                     "steps": steps})
    return rows


def sweep_spec(steps: int, runs: int, name: str) -> dict:
    return {"name": name, "notebook": str(TEMPLATE), "timeout": 600, "seeds": list(range(runs)),
            "base": {k: v for k, v in run_config(steps).to_dict().items() if k not in ("seed", "measure")}}


def workers_speedup(steps: int, runs: int, repeats: int, scratch: Path) -> list[dict]:
    seconds: dict[int, list[float]] = {1: [], 2: []}
    for r in range(repeats):
        for workers in (1, 2) if r % 2 == 0 else (2, 1):
            spec = parse_spec(sweep_spec(steps, runs, f"w{workers}r{r}"), base_dir=ROOT)
            start = time.perf_counter()
            # fuse off: the runs differ only in seed, so the default would train them as one fused group
            report = run_sweep(spec, runs_root=scratch, executor="local", workers=workers, fuse="off",
                               progress=False)
            seconds[workers].append(time.perf_counter() - start)
            if not report.all_finished:
                raise RuntimeError(report.summary())
    rows = []
    for workers in (1, 2):
        med, spread = median_and_spread(seconds[workers])
        rows.append({"measure": "sweep_seconds", "variant": f"{workers} worker(s)", "median": med, "spread": spread,
                     "speedup_vs_1": statistics.median(seconds[1]) / med, "n": len(seconds[workers]),
                     "steps": steps, "runs": runs})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="training steps per run [2000, about 4 s]")
    p.add_argument("--runs", type=int, default=6, help="runs per sweep in the workers comparison [6]")
    p.add_argument("--repeats", type=int, default=4, help="alternated repetitions [4]")
    p.add_argument("--tiny", action="store_true", help="a few seconds' check that the script works")
    args = p.parse_args()
    if args.tiny:
        args.steps, args.runs, args.repeats = 20, 2, 1
    with tempfile.TemporaryDirectory(prefix="bsresearch-bench-") as tmp:
        rows = per_run_overhead(args.steps, args.repeats, Path(tmp))
        rows += workers_speedup(args.steps, args.runs, args.repeats, Path(tmp))
    table = pd.DataFrame(rows)
    print(f"cores available: {len(os.sched_getaffinity(0))}")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if not args.tiny:
        import torch
        RESULTS.mkdir(exist_ok=True)
        path = RESULTS / f"sweep_overhead_{machine_label(torch.device('cpu'))}.csv"
        table.to_csv(path, index=False)
        print(f"written to {path}")


if __name__ == "__main__":
    main()
