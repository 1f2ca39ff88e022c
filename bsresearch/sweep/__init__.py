"""Sweeps: an experiment spec (experiments/*.yaml) expanded into runs, executed by papermill or the library
on local worker processes or a Dask cluster, resumable after any interruption.

    from bsresearch.sweep import run_sweep
    report = run_sweep("experiments/smoke.yaml", executor="local", workers=2)

Modules: spec (YAML -> validated SweepSpec -> Points), task (RunTask/GroupTask/RunOutcome, the run lock),
worker (execute one run, the runner's own status), supervise (one worker process per run, timeouts),
executors (inline, local, Dask, Slurm/PBS), cost (each task's cost estimated from its configs: the runner
starts the longest first), runner (plan, fused groups, execute, report), cli
(`bsresearch sweep`). Which runs fuse, and how many at once: bsresearch.fused.grouping.
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
from .runner import MANIFEST, PlannedRun, SweepReport, assign_groups, check_data, plan, run_sweep
from .spec import Override, Point, SweepSpec, expand, load_spec, parse_spec
from .supervise import run_any, run_task
from .task import GroupTask, RunOutcome, RunTask, is_complete, is_locked, run_lock
from .variants import runs_per_variant, variant_order
from .worker import execute, execute_task

__all__ = ["CLUSTERS", "EXECUTORS", "InlineExecutor", "default_workers", "job_script", "jobqueue_cluster",
           "make_executor", "visible_gpus", "MANIFEST", "PlannedRun", "SweepReport", "assign_groups", "check_data",
           "plan", "run_sweep", "Override", "Point", "SweepSpec", "expand", "load_spec", "parse_spec", "run_any",
           "run_task", "GroupTask", "RunOutcome", "RunTask", "is_complete", "is_locked", "run_lock", "execute",
           "execute_task", "runs_per_variant", "variant_order"]
