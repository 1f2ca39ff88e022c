"""A sweep's run phase with --fuse off against --fuse auto, end to end on this machine, and whether the
numbers agree: the same spec executed both ways into fresh run directories, alternating which goes first
each round (papermill, local workers, as `make demo` runs it).

Agreement per run: the same number of steps, train and test loss within a relative 1e-3, accuracies within
2 examples' worth of the test set (the fused trainer agrees with separate runs to float32 rounding; over
thousands of Adam steps that rounding grows, and a borderline example may flip).

    python benchmarks/fused_sweep.py experiments/demo.yaml --workers 2 [--rounds 1] [--engine library] [--keep DIR]
With --keep the run directories stay under DIR/<round>-<mode>/ (a finished sweep whose runs a report can use),
and `--keep DIR --summarize-only` rewrites the result files from them. Writes benchmarks/results/
fused_sweep_<spec>_<machine>.csv (per run: steps and final metrics both ways) and ..._summary_... (the wall
times, their ratio, and the share of the runs' time in runs that fuse: 1/(1 - share) bounds the speed-up).
Run it on a quiet machine; report the CPU and what else was running.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch
from common import RESULTS, write_results

from bsresearch.rundir import RunDir
from bsresearch.sweep import run_sweep
from bsresearch.sweep.spec import load_spec


def compare(spec: str, runs_off: Path, runs_auto: Path, name: str) -> pd.DataFrame:
    rows = []
    for run_dir in sorted((runs_off / name).iterdir()):
        if not (run_dir / "metrics.json").exists():
            continue
        a, b = RunDir(run_dir).metrics(), RunDir(runs_auto / name / run_dir.name).metrics()
        rows.append({"run_id": run_dir.name, "batch_size": RunDir(run_dir).config()["batch_size"],
                     "seed": RunDir(run_dir).config()["seed"], "steps_off": a["steps"], "steps_auto": b["steps"],
                     **{f"{k}_rel_diff": abs(a[k] - b[k]) / abs(a[k]) for k in ("train_loss", "test_loss")},
                     **{f"{k}_diff": abs(a[k] - b[k]) for k in ("train_acc", "test_acc")}})
    return pd.DataFrame(rows)


def fused_share(runs_off: Path, name: str) -> float:
    """The fraction of the --fuse off runs' own time (started to ended) spent in runs --fuse auto would fuse
    (the batch sizes fusing allows on this device): the most fusing can save is that fraction."""
    from bsresearch.config import RunConfig
    from bsresearch.fused.grouping import cpu_fuse_max_batch
    fusable = total = 0.0
    for run_dir in (runs_off / name).iterdir():
        if not (run_dir / "metrics.json").exists():
            continue
        status = RunDir(run_dir).status() or {}
        seconds = (pd.Timestamp(status["ended"]) - pd.Timestamp(status["started"])).total_seconds()
        total += seconds
        cfg = RunConfig.from_json((run_dir / "config.json").read_text())
        fusable += seconds if cfg.batch_size <= cpu_fuse_max_batch(cfg) else 0.0
    return fusable / total


def summarize(root: Path, spec_name: str, times: dict[str, list[float]], out_dir: Path) -> bool:
    """Print and write (benchmarks/results/fused_sweep_<spec>_<machine>.csv, one row per run, and
    ..._summary_...csv) the comparison of round 0; True when every run's numbers agree."""
    table = compare(str(root), root / "0-off", root / "0-auto", spec_name)
    ok = bool((table.steps_off == table.steps_auto).all() and (table.train_loss_rel_diff < 1e-3).all()
              and (table.test_loss_rel_diff < 1e-3).all() and (table.test_acc_diff <= 2 / 1000).all())
    same = table.steps_off == table.steps_auto
    share = fused_share(root / "0-off", spec_name)
    off, auto = statistics.median(times["off"]), statistics.median(times["auto"])
    summary = pd.DataFrame([{"spec": spec_name, "runs": len(table), "seconds_off": off, "seconds_auto": auto,
                             "speedup": off / auto, "fusable_share_of_run_time": share,
                             "bound_if_fused_runs_were_free": 1 / (1 - share),
                             "runs_same_steps": int(same.sum()), "all_numbers_agree": ok}])
    device = torch.device("cpu")
    write_results(table, f"fused_sweep_{spec_name}", device, out_dir)
    write_results(summary, f"fused_sweep_{spec_name}_summary", device, out_dir)
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--engine", default="papermill")
    p.add_argument("--keep", type=Path, help="keep the run directories under this folder (default: a temporary one)")
    p.add_argument("--summarize-only", action="store_true",
                   help="run nothing: summarise the runs and times.json kept under --keep")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where the CSVs go")
    args = p.parse_args(argv)
    spec_name = load_spec(args.spec).name
    if args.summarize_only:
        if args.keep is None:
            p.error("--summarize-only needs --keep DIR (the folder of an earlier run)")
        times = json.loads((args.keep / "times.json").read_text())
        return 0 if summarize(args.keep, spec_name, times, args.out_dir) else 1
    times: dict[str, list[float]] = {"off": [], "auto": []}
    with tempfile.TemporaryDirectory(prefix="fused_sweep_") as scratch:
        root = args.keep or Path(scratch)
        for r in range(args.rounds):
            order = ("off", "auto") if r % 2 == 0 else ("auto", "off")
            for mode in order:
                report = run_sweep(args.spec, runs_root=root / f"{r}-{mode}", workers=args.workers,
                                   engine=args.engine, fuse=mode, progress=False)
                times[mode].append(report.seconds)
                print(f"round {r} --fuse {mode}: {report.seconds:.1f} s, {len(report.groups)} fused group(s), "
                      f"all finished: {report.all_finished}", flush=True)
        (root / "times.json").write_text(json.dumps(times))
        ok = summarize(root, spec_name, times, args.out_dir)
    print(f"wall time of the run phase, s: off {times['off']}, auto {times['auto']}; numbers agree: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
