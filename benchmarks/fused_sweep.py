"""A sweep's run phase with --fuse off against --fuse auto, end to end on this machine, and whether the
numbers agree: the same spec executed both ways into fresh run directories, alternating which goes first
each round (papermill, local workers, as `make demo` runs it).

Agreement per run: the same number of steps, train and test loss within a relative 1e-3, accuracies within
2 examples' worth of the test set (the fused trainer agrees with separate runs to float32 rounding; over
thousands of Adam steps that rounding grows, and a borderline example may flip).

    python benchmarks/fused_sweep.py experiments/demo.yaml --workers 2 [--rounds 1] [--engine library] [--keep DIR]
With --keep the run directories stay under DIR/<round>-<mode>/ (a finished sweep whose runs a report can use).
Run it on a quiet machine; report the CPU and what else was running.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

from bsresearch.rundir import RunDir
from bsresearch.sweep import run_sweep


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--engine", default="papermill")
    p.add_argument("--keep", type=Path, help="keep the run directories under this folder (default: a temporary one)")
    args = p.parse_args(argv)
    times: dict[str, list[float]] = {"off": [], "auto": []}
    with tempfile.TemporaryDirectory(prefix="fused_sweep_") as scratch:
        tmp = args.keep or Path(scratch)
        for r in range(args.rounds):
            order = ("off", "auto") if r % 2 == 0 else ("auto", "off")
            for mode in order:
                report = run_sweep(args.spec, runs_root=Path(tmp) / f"{r}-{mode}", workers=args.workers,
                                   engine=args.engine, fuse=mode, progress=False)
                times[mode].append(report.seconds)
                print(f"round {r} --fuse {mode}: {report.seconds:.1f} s, {len(report.groups)} fused group(s), "
                      f"all finished: {report.all_finished}", flush=True)
        table = compare(args.spec, Path(tmp) / "0-off", Path(tmp) / "0-auto", report.spec.name)
    pd.set_option("display.width", 200)
    print(table.to_string(index=False))
    ok = ((table.steps_off == table.steps_auto).all() and (table.train_loss_rel_diff < 1e-3).all()
          and (table.test_loss_rel_diff < 1e-3).all() and (table.test_acc_diff <= 2 / 1000).all())
    print(f"wall time of the run phase, s: off {times['off']}, auto {times['auto']}; numbers agree: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
