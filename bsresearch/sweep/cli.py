"""`bsresearch sweep SPEC ...`: plan and execute a sweep (registered in bsresearch.cli.COMMANDS)."""
from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError
from ..devices.launcher import LAUNCHERS
from ..devices.launcher import VARIABLE as LAUNCHER_VARIABLE
from ..paths import project_folder
from .executors import CLUSTERS, EXECUTORS

EXAMPLES = """examples:
  bsresearch sweep experiments/smoke.yaml --dry-run          # list the runs and what would be done
  bsresearch sweep experiments/demo.yaml --workers 2         # papermill, 2 local worker processes
  bsresearch sweep experiments/demo.yaml --executor inline   # in this process, no notebooks
  bsresearch sweep experiments/demo.yaml --executor dask --scheduler tcp://head:8786
  bsresearch sweep experiments/demo.yaml --executor dask --cluster slurm --workers 8 \\
      --cluster-option queue=gpu --cluster-option 'job_extra_directives=["--gres=gpu:1"]'
  bsresearch sweep experiments/demo.yaml --cluster slurm --job-script   # print a worker job script
  bsresearch sweep experiments/demo.yaml --launcher srun --workers 4   # in salloc/sbatch: a job step per run
  bsresearch sweep experiments/demo.yaml --check            # damaged result files, unfinished runs
  bsresearch sweep experiments/demo.yaml --pack archives/    # finished runs not yet archived -> a new .tar.xz
  bsresearch sweep experiments/demo.yaml --unpack archives/  # on another machine: restore them, then resume
Stop a sweep with Ctrl-C or `kill PID` (SIGTERM): either stops its workers, and the runs they held are redone
by the next run of the sweep. Rerunning a sweep skips finished runs and redoes interrupted ones; --retry-failed
also redoes failed, oom, timeout and died runs."""


def _stop_on_sigterm() -> None:
    """`kill PID` stops the sweep as Ctrl-C does (workers stopped, "interrupted" said). A sweep started in the
    background of a script (`cmd &`) ignores SIGINT, as the shell leaves it, so SIGTERM is how to stop it."""
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)


def parse_cluster_options(items: list[str] | None) -> dict[str, Any]:
    """KEY=VALUE strings -> dict; values are read as YAML (numbers, lists, quoted strings)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--cluster-option must be KEY=VALUE; got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
            raise ConfigError(f"--cluster-option {key}: cannot read {value!r} as YAML: {problem}") from None
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run every point of an experiment spec (resumable)",
                       description="Expand an experiment spec into runs and execute them: papermill runs the "
                                   "spec's notebook per run (or, inline, the library is called directly).",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("spec", help="experiment spec, e.g. experiments/demo.yaml")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="inline: this process, library calls; local: worker processes here; dask: a Dask "
                        "cluster [local]")
    p.add_argument("--workers", type=int, help="worker processes (local), or Dask workers/jobs to start "
                                               "[one per GPU, else one per CPU core]")
    p.add_argument("--scheduler", help="address of a running Dask scheduler (with --executor dask)")
    p.add_argument("--cluster", choices=CLUSTERS, help="start Dask workers as Slurm or PBS jobs (dask-jobqueue)")
    p.add_argument("--cluster-option", action="append", metavar="KEY=VALUE",
                   help="dask-jobqueue option, e.g. queue=gpu, walltime=02:00:00, memory=8GB (repeatable)")
    p.add_argument("--job-script", action="store_true", help="print the job script of one --cluster worker and exit")
    p.add_argument("--engine", choices=("papermill", "library"),
                   help="papermill: execute the spec's notebook per run; library: call train.run "
                        "[papermill, library for inline]")
    p.add_argument("--runs", type=project_folder("runs"),
                   help="root folder of run directories (relative: to the working directory) [runs/ of the project "
                        "that holds the spec, whatever the working directory]")
    p.add_argument("--timeout", type=float, help="seconds per run before it is killed [the spec's timeout]")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, list the runs and what would be done; run nothing")
    p.add_argument("--check", action="store_true",
                   help="check the runs on disk: name each damaged result file and count the unfinished runs; "
                        "run nothing (exit 0 only when every run has ended with readable results)")
    p.add_argument("--pack", metavar="FOLDER", type=Path,
                   help="write the finished runs that no archive in FOLDER holds yet into a new archive there "
                        "(<sweep>-<time>-<machine>.tar.xz: result files, no checkpoints); run nothing")
    p.add_argument("--unpack", metavar="FOLDER", type=Path,
                   help="restore the finished runs archived in FOLDER (by --pack, on any machine) that have not "
                        "finished here; run nothing: the next sweep skips them")
    p.add_argument("--retry-failed", action="store_true", help="also redo runs that failed, ran out of memory, "
                                                               "timed out or died")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--fuse", choices=("auto", "off"), default="auto",
                   help="auto: train pending runs that differ only in seed and shape-free hyperparameters "
                        "together, as fused groups; off: every run alone [auto]")
    p.add_argument("--launcher", choices=LAUNCHERS,
                   help="how each run on several devices (devices: N) starts its N processes: processes: on its "
                        "worker's machine, with torch.multiprocessing; srun: as one Slurm job step of N tasks "
                        "inside the current allocation (run the sweep inside salloc or an sbatch script) "
                        f"[${LAUNCHER_VARIABLE} or processes]")
    p.add_argument("--fuse-max", type=int, metavar="K", help="at most K runs per fused group [32 on a CPU; "
                                                              "on CUDA what the memory model says fits]")
    p.set_defaults(handler=_cmd_sweep)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .executors import job_script
    from .runner import run_sweep
    from .spec import load_spec

    options = parse_cluster_options(args.cluster_option)
    spec = load_spec(args.spec)
    if args.check:
        return _check(spec, args.runs)
    if args.pack or args.unpack:
        return _archive(spec, args)
    if args.job_script:
        if not args.cluster:
            raise ConfigError("--job-script needs --cluster slurm or --cluster pbs")
        print(job_script(args.cluster, options))
        return 0
    if (args.cluster or args.scheduler) and args.executor == "inline":
        raise ConfigError("--scheduler and --cluster run on Dask: use --executor dask")
    executor = "dask" if (args.cluster or args.scheduler) else args.executor
    if not args.dry_run:
        _stop_on_sigterm()
    report = run_sweep(spec, runs_root=args.runs, executor=executor, workers=args.workers,
                       scheduler=args.scheduler, cluster=args.cluster, cluster_options=options, engine=args.engine,
                       retry_failed=args.retry_failed, dry_run=args.dry_run, timeout=args.timeout,
                       progress=False if args.quiet else None, fuse=args.fuse, fuse_max=args.fuse_max,
                       launcher=args.launcher)
    if args.dry_run:
        print(report.plan_table())
        todo = sum(p.action == "run" for p in report.planned)
        grouped = sum(len(m) for m in report.groups.values())
        fused = f" ({grouped} in {len(report.groups)} fused group(s), {todo - grouped} alone)" if report.groups else ""
        print(f"{len(report.planned)} runs in {report.sweep_dir}: {todo} to run{fused} "
              f"({report.executor}/{report.engine}, {report.workers} worker(s)), started in the order of the start "
              f"column (longest estimated first); nothing was run (--dry-run)")
        return 0
    print(report.summary())
    return 0 if report.all_finished else 1


def _archive(spec, args: argparse.Namespace) -> int:
    from . import archive
    from .spec import runs_folder
    if args.pack and args.unpack:
        raise ConfigError("--pack and --unpack: give one of them")
    if not spec.has_runs:
        raise ConfigError(f"spec {spec.name!r} defines no runs (it is analysis-only): nothing to archive")
    if args.unpack:
        restored = archive.unpack(spec, args.unpack, args.runs)
        print(restored.summary(spec.name, args.unpack, runs_folder(spec, args.runs) / spec.name))
        return 0
    from ..rundir import check_writable
    from ..systems.bench import device_label
    check_writable(args.pack, "--pack")
    print(archive.pack(spec, args.pack, args.runs, machine=device_label("cpu")).summary(spec.name, args.pack))
    return 0


def _check(spec, runs_root: str) -> int:
    from collections import Counter

    from .runner import sweep_state, unfinished_summary
    if not spec.has_runs:
        raise ConfigError(f"spec {spec.name!r} defines no runs (it is analysis-only): nothing to check")
    planned = sweep_state(spec, runs_root)
    damaged = [p for p in planned if p.found == "damaged"]
    unfinished = unfinished_summary(planned)
    for p in damaged:
        print(f"damaged  {p.point.run_id}  {p.point.label}: {p.problem}; delete {p.run_dir} to redo the run")
    counts = Counter("running" if p.action == "busy" else p.found for p in planned)
    print(f"sweep {spec.name}: {len(planned)} runs: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
          + (f"; {unfinished}" if unfinished else ""))
    return 1 if damaged or unfinished else 0
