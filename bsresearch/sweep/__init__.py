"""Sweeps: an experiment spec (experiments/*.yaml) expanded into runs, executed by papermill or the library
on local worker processes or a Dask cluster, resumable after any interruption.

    from bsresearch.sweep import run_sweep
    report = run_sweep("experiments/smoke.yaml", executor="local", workers=2)

Modules: spec (YAML -> validated SweepSpec -> Points), task (RunTask/RunOutcome, the run lock),
worker (execute one run, the runner's own status), supervise (one worker process per run, timeouts),
executors (inline, local, Dask, Slurm/PBS), runner (plan, execute, report), cli (`bsresearch sweep`).
"""
from __future__ import annotations

from .executors import (
                        CLUSTERS,
                        EXECUTORS,
                        InlineExecutor,
                        default_workers,
                        job_script,
                        jobqueue_cluster,
                        make_executor,
                        visible_gpus,
)
from .runner import MANIFEST, PlannedRun, SweepReport, check_data, plan, run_sweep
from .spec import Override, Point, SweepSpec, expand, load_spec, parse_spec
from .supervise import run_task
from .task import RunOutcome, RunTask, is_complete, is_locked, run_lock
from .variants import runs_per_variant, variant_order
from .worker import execute_task

__all__ = ["CLUSTERS", "EXECUTORS", "InlineExecutor", "default_workers", "job_script", "jobqueue_cluster",
           "make_executor", "visible_gpus", "MANIFEST", "PlannedRun", "SweepReport", "check_data", "plan",
           "run_sweep", "Override", "Point", "SweepSpec", "expand", "load_spec", "parse_spec", "run_task",
           "RunOutcome", "RunTask", "is_complete", "is_locked", "run_lock", "execute_task", "runs_per_variant",
           "variant_order"]
