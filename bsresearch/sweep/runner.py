"""A sweep: spec -> planned runs (finished ones skipped) -> executed on an Executor -> a report.

    report = run_sweep("experiments/keskar.yaml", executor="local", workers=2)
    print(report.summary())

Run directories are RUNS/<name>/<run_id>/; RUNS/<name>/sweep.json lists the sweep's points (the manifest
results.load reads). What happens to a run directory found on disk:
- ok, diverged: finished, skipped (unless killed while its notebook was still plotting: the notebook is
  executed again, and train.run returns the finished training without redoing it);
- running with its lock free (its process died, e.g. the sweep was killed), or no status: redone;
- failed, oom, timeout, died: kept, and redone with retry_failed;
- locked by a live process (another sweep is running it): left alone ("busy"); at the end the sweep waits
  for that process to finish it and counts what it recorded, so two sweeps of one spec both end "ok 4";
- finished, but a result file damaged (unreadable history.csv, metrics.json or config.json): "damaged",
  named with the file in the summary, skipped; deleting the run directory gets it redone.
A failing run never stops the sweep; only a bad spec does, before anything runs.

Fused runs (--fuse auto, the default): pending runs that can train together (bsresearch.fused.grouping)
are executed as one task per group, through the group template notebook (papermill) or train_group
(library). Their run directories are the same as unfused runs' (status.json adds the group id); the
group's notebook and log are in RUNS/<name>/groups/<group_id>/. Runs left alone are ordinary runs, and the
plan says why each was not fused. Data a run would stream joins a group resident when it fits
grouping.RESIDENT_MAX_BYTES, else its runs stay alone (check_data measures it, assign_groups decides).
"""
from __future__ import annotations

import importlib.util
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import templates
from ..config import ConfigError, RunConfig
from ..devices.launcher import allocation_tasks, check_launcher, device_launcher, launcher_environment
from ..paths import working_directory
from ..rundir import (
    FINISHED_STATES,
    MANIFEST,
    RunDir,
    atomic_write_json,
    check_writable,
    make_reserve,
    now,
    storage_error,
)
from ..schedule import check_data_size
from . import supervise
from .cost import longest_first, task_seconds
from .executors import check_dask, default_workers, make_executor, visible_gpus
from .spec import Point, SweepSpec, expand, load_spec, runs_folder
from .task import BUSY, GroupTask, RunOutcome, RunTask, is_complete, is_locked
from .worker import execute

if TYPE_CHECKING:
    from ..fused.grouping import Blocker

RETRYABLE_STATES = ("failed", "oom", "timeout", "died")
FUSE_MODES = ("auto", "off")
RUN_TEMPLATE = "01_train.ipynb"     # the run template whose work the group template does for many runs
GROUP_TEMPLATE = templates.folder() / f"{templates.GROUP_TEMPLATE}.ipynb"   # the packaged group template
GROUPS_DIR = "groups"               # RUNS/<name>/groups/<group_id>/: a fused group's notebook and log


@dataclass(frozen=True)
class PlannedRun:
    """A point of the sweep, what was found in its run directory, and what the sweep will do."""
    point: Point
    run_dir: Path
    found: str    # new, interrupted (left running by a dead process), unfinished (trained, notebook cut
                  # short), damaged (finished, a result file unreadable), or the state on disk
    action: str   # run | skip | busy
    problem: str = ""  # found damaged: which file and what is wrong with it
    group: str | None = None   # the fused group it runs in (None: alone, or not run)
    fusion: str | None = None  # --fuse auto, a run left alone: why it was not fused
    data: str | None = None    # --fuse auto, a run in a group: how its data reaches the group, if planned


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did: the plan, the outcome of each executed run, the wall time."""
    spec: SweepSpec
    sweep_dir: Path
    executor: str
    engine: str
    workers: int
    planned: tuple[PlannedRun, ...]
    outcomes: tuple[RunOutcome, ...]
    seconds: float
    dry_run: bool = False
    waited: tuple[RunOutcome, ...] = ()  # runs another live process held: what it recorded when done
    fuse: str = "off"
    dispatch: tuple[tuple[str, ...], ...] = ()  # the run ids of each task, in the order they are dispatched
    launcher: str = "processes"  # how a run on several devices starts its processes (bsresearch.devices.launcher)

    def final_states(self) -> dict[str, str]:
        """run_id -> state after the sweep (executed runs: their outcome; runs another process held: what
        it recorded; others: what was found)."""
        states = {p.point.run_id: p.found for p in self.planned}
        states.update({o.run_id: o.state for o in self.outcomes if o.state != BUSY})
        states.update({o.run_id: o.state for o in self.waited})
        return states

    @property
    def all_finished(self) -> bool:
        return all(s in FINISHED_STATES for s in self.final_states().values())

    def plan_table(self) -> str:
        """The runs in the spec's order; `start`: the place of the run's task in the dispatch order (1 starts
        first: longest estimated first, bsresearch.sweep.cost), '-' for a run not executed."""
        width = max([len(p.point.label) for p in self.planned] + [5])
        start = {run_id: str(k) for k, task in enumerate(self.dispatch, 1) for run_id in task}
        if self.fuse == "off":
            lines = [f"{'run_id':<10}  {'point':<{width}}  {'found':<11}  {'action':<6}  start"]
            lines += [f"{p.point.run_id:<10}  {p.point.label:<{width}}  {p.found:<11}  {p.action:<6}  "
                      f"{start.get(p.point.run_id, '-')}" for p in self.planned]
            return "\n".join(lines)
        lines = [f"{'run_id':<10}  {'point':<{width}}  {'found':<11}  {'action':<6}  {'start':<5}  {'group':<10}  "
                 "why not fused"]
        lines += [f"{p.point.run_id:<10}  {p.point.label:<{width}}  {p.found:<11}  {p.action:<6}  "
                  f"{start.get(p.point.run_id, '-'):<5}  {p.group or '-':<10}  {p.fusion or ''}".rstrip()
                  for p in self.planned]
        decided = {p.group: p.data for p in self.planned if p.group and p.data}   # one line per group
        lines += [f"group {group}: {data}" for group, data in decided.items()]
        return "\n".join(lines)

    @property
    def groups(self) -> dict[str, list[str]]:
        """group id -> run ids of its members, for the runs planned in a fused group."""
        out: dict[str, list[str]] = {}
        for p in self.planned:
            if p.group:
                out.setdefault(p.group, []).append(p.point.run_id)
        return out

    def allocation(self) -> str:
        """The devices each run trains on: '2 devices per run (worker 0: GPUs 0,1; worker 1: GPUs 2,3)' on the
        local executor with GPUs, '2 devices per run (one Slurm job step of 2 tasks per run)' with the srun
        launcher, else the processes each run starts (one per device; a Dask or Slurm worker must hold that
        many devices)."""
        devices = max(p.point.devices for p in self.planned)
        if self.launcher == "srun":
            return f"{devices} devices per run (one Slurm job step of {devices} tasks per run)"
        gpus = visible_gpus() if self.executor == "local" else ()
        if gpus and self.executor == "local":
            slots = "; ".join(f"worker {w}: GPUs " + ",".join(supervise.slot_gpus(gpus, w, devices))
                              for w in range(self.workers))
            return f"{devices} devices per run ({slots})"
        return f"{devices} devices per run (one process each, started by the run)"

    def summary(self) -> str:
        counts = Counter(self.final_states().values())
        # a busy run, or one finished since this sweep planned it, was executed by another process
        ran = sum(o.state != BUSY and not o.elsewhere for o in self.outcomes)
        others = len(self.waited) + sum(o.elsewhere for o in self.outcomes)
        how = [f"{ran} executed with {self.executor}/{self.engine}", f"{self.workers} worker(s)"]
        how += [f"{len(self.groups)} fused group(s)"] * bool(self.groups)
        how += [self.allocation()] * any(p.point.devices > 1 for p in self.planned)
        how += [f"{others} run by another process"] * bool(others)
        lines = [f"sweep {self.spec.name}: {len(self.planned)} runs in {self.sweep_dir} "
                 f"({', '.join(how)}, {self.seconds:.1f} s)",
                 "  " + ", ".join(f"{state} {n}" for state, n in sorted(counts.items()))]
        for p in self.planned:
            if p.found == "damaged":
                lines.append(f"  damaged  {p.point.run_id}  {p.point.label}: {p.problem}; delete {p.run_dir} "
                             f"to redo the run")
        for o in self.outcomes:
            if o.state == BUSY:
                continue
            if o.state not in FINISHED_STATES or o.notebook_error:
                detail = o.error if o.state not in FINISHED_STATES else f"notebook: {o.notebook_error}"
                lines.append(f"  {o.state:<8} {o.run_id}  {o.label}: {(detail or '').splitlines()[0][:160]}")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- planning
def plan(points: Iterable[Point], sweep_dir: Path, retry_failed: bool = False) -> list[PlannedRun]:
    """Decide, for each point, from its run directory on disk, whether to run it. A finished run of a notebook of
    one's own is done whatever became of its notebook's later cells (executed again, it would train again)."""
    out = []
    for point in points:
        run_dir = sweep_dir / point.run_id
        state = RunDir(run_dir).state()
        status_problem = RunDir(run_dir).status_problem()
        if is_locked(run_dir):
            found, action = state or "new", BUSY
        elif status_problem:  # its state is unknown: neither redone over nor counted, until the user looks
            out.append(PlannedRun(point, run_dir, "damaged", "skip", status_problem))
            continue
        elif is_complete(run_dir) or (point.config is None and state in FINISHED_STATES):
            damage = RunDir(run_dir).damage()
            if damage:
                out.append(PlannedRun(point, run_dir, "damaged", "skip", "; ".join(damage)))
                continue
            found, action = str(state), "skip"
        elif state in FINISHED_STATES:  # trained, but killed before its notebook ended: finish the notebook
            found, action = "unfinished", "run"
        elif state in RETRYABLE_STATES:
            found, action = state, "run" if retry_failed else "skip"
        else:  # no status, or "running" with nobody holding the lock
            found, action = ("interrupted" if state == "running" else "new"), "run"
        out.append(PlannedRun(point, run_dir, found, action))
    return out


def sweep_state(spec: SweepSpec, runs_root: str | Path | None = None) -> list[PlannedRun]:
    """What is on disk for each run of the spec (nothing is run or written): `found` is new, interrupted,
    unfinished, damaged (with `problem`), or the recorded state; `action` busy while a live process holds it.
    runs_root: the spec's project's runs/ by default (SweepSpec.project)."""
    return plan(expand(spec), runs_folder(spec, runs_root) / spec.name)



def unfinished_summary(planned: list[PlannedRun]) -> str | None:
    """'3 of 8 runs not finished (2 pending, 1 running)', or None when every run has ended."""
    running = sum(p.action == BUSY for p in planned)
    pending = sum(p.action != BUSY and p.found in ("new", "interrupted", "unfinished") for p in planned)
    if not running and not pending:
        return None
    parts = [f"{pending} pending"] * bool(pending) + [f"{running} running"] * bool(running)
    return f"{pending + running} of {len(planned)} runs not finished ({', '.join(parts)})"


def assign_groups(planned: list[PlannedRun], workers: int, fuse_max: int | None = None,
                  engine: str = "library", notebook: Path | None = None, gpus: tuple[str, ...] = (),
                  blocker: Blocker | None = None, streamed: dict[str, int] | None = None) -> list[PlannedRun]:
    """The plan with the runs to execute put in fused groups (bsresearch.fused.grouping), and for each run
    left alone why. fuse_max: the most runs per group (default: by device, grouping.default_fuse_max).

    streamed (check_data's answer): run id -> the bytes as tensors of data its worker would stream (a map-style
    Dataset from the user's factory, data_loading auto). A fused group needs its data resident: such a run joins
    a group with data_loading resident when the data fits grouping.RESIDENT_MAX_BYTES (its `data` says so), else
    it runs alone, streamed, and says why. Without it (a remote cluster, whose data this machine may not see),
    the fused trainer makes the same decision at run time."""
    from ..fused.grouping import cpu_batch_too_large, default_fuse_max, group_configs, group_id, residency
    todo = [k for k, p in enumerate(planned) if p.action == "run" and p.point.config is not None]
    cfgs = [cfg for k in todo if (cfg := planned[k].point.config) is not None]   # a notebook of one's own: alone
    device = cfgs[0].device if cfgs else "cpu"
    on_gpu = device.startswith("cuda") or (device == "auto" and bool(gpus))
    excluded = {}
    resident: dict[int, str] = {}   # runs whose data a group would hold resident, and the line that says so
    for n, k in enumerate(todo):
        too_large = None if on_gpu else cpu_batch_too_large(cfgs[n])
        if too_large:
            excluded[n] = too_large
        elif planned[k].found == "unfinished":
            excluded[n] = "trained already; only its notebook is executed again"
        elif engine == "papermill" and notebook is not None and notebook.name != RUN_TEMPLATE:
            excluded[n] = (f"the spec's notebook {notebook.name} is not the run template {RUN_TEMPLATE}: "
                           "its runs are executed one by one")
        elif cfgs[n].data_loading == "auto" and (streamed or {}).get(planned[k].point.run_id) is not None:
            fits, why = residency((streamed or {})[planned[k].point.run_id])
            if fits:
                cfgs[n], resident[n] = cfgs[n].replace(data_loading="resident"), why
            else:
                excluded[n] = why
    if fuse_max is None:
        fuse_max = default_fuse_max("cuda" if on_gpu else "cpu")
    grouping = group_configs(cfgs, fuse_max, workers, blocker, excluded)
    out = list(planned)
    for members in grouping.groups:
        gid = group_id([planned[todo[n]].point.run_id for n in members])
        for n in members:
            p = planned[todo[n]]
            out[todo[n]] = replace(p, group=gid, point=replace(p.point, config=cfgs[n]), data=resident.get(n))
    for n, reason in grouping.alone.items():
        out[todo[n]] = replace(planned[todo[n]], fusion=reason)
    return out


def check_data(points: list[Point]) -> dict[str, int]:
    """Load each dataset the points use once (on the CPU), check every batch fits, check each model with its
    data and loss in one dry run (runsetup.RunSetup.checked), and that each device asked for exists here: a missing
    dataset, a model file that does not import, an output the loss cannot take, a batch larger than the
    training set or `device: cuda` on a machine without one is reported now, not by each worker.

    Returns run id -> bytes as tensors, for each run whose worker would stream its data (a map-style Dataset
    from the user's factory, data_loading auto): what assign_groups decides fusing with."""
    import torch

    from ..data import dataset_for  # imports torch
    from ..fused.grouping import resident_bytes
    from ..losses import loss_for
    from ..models import model_for
    from ..runsetup import RunSetup
    from ..runtime import resolve_device
    datasets: dict[tuple, Any] = {}
    checked: set[tuple] = set()
    sizes: dict[tuple, int | None] = {}   # data key -> bytes as tensors of data served streamed
    streamed: dict[str, int] = {}
    for point in points:
        cfg = point.config
        if cfg is None:  # a notebook of one's own: its code is checked where it runs
            continue
        data_key = (cfg.dataset, cfg.dataset_kwargs, cfg.test_size, cfg.data_dir, cfg.train_size)
        model_key = (*data_key, cfg.model, cfg.model_kwargs, cfg.width, cfg.depth, cfg.batchnorm,
                     cfg.ghost_batch_size, cfg.loss, cfg.precision)
        try:
            resolve_device(cfg.device)
            if data_key not in datasets:
                datasets[data_key] = dataset_for(cfg.replace(data_loading="auto", loader_workers=0), "cpu")
            data = datasets[data_key]
            check_data_size(cfg, data.n_train)
            if data_key not in sizes:
                sizes[data_key] = None if data.resident else resident_bytes(data)
            if cfg.data_loading == "auto" and sizes[data_key] is not None:
                streamed[point.run_id] = int(sizes[data_key] or 0)
            if model_key not in checked and cfg.precision != "fp16":  # fp16 needs CUDA; the worker checks it there
                RunSetup.checked(model_for(cfg, data, torch.Generator().manual_seed(0)), data, loss_for(cfg.loss),
                                 cfg.precision, cfg.model, f"dataset {cfg.dataset}")
                checked.add(model_key)
        except ConfigError as exc:
            raise ConfigError(f"grid point {point.label}: {exc}") from None
    return streamed


def write_manifest(spec: SweepSpec, sweep_dir: Path, points: list[Point]) -> None:
    """RUNS/<name>/sweep.json: the spec as written and the points, so results.load knows the sweep."""
    from ..source import git_commit
    atomic_write_json(sweep_dir / MANIFEST, {
        "name": spec.name, "description": spec.description, "spec_file": str(spec.path) if spec.path else None,
        "own_notebook": str(spec.own.path) if spec.own else None,
        "spec": spec.raw, "updated": now(), "git_commit": git_commit(),
        "axes": list(points[0].coords) if points else [],  # in the spec's order (the JSON keys get sorted)
        "points": [{"run_id": p.run_id, "label": p.label, "coords": p.coords} for p in points],
    })


# ----------------------------------------------------------------------------- execution
def run_sweep(spec: SweepSpec | str | Path, runs_root: str | Path | None = None, executor: str = "local",
              workers: int | None = None, scheduler: str | None = None, cluster: str | None = None,
              cluster_options: dict[str, Any] | None = None, engine: str | None = None,
              retry_failed: bool = False, dry_run: bool = False, timeout: float | None = None,
              progress: bool | None = None, fuse: str = "auto", fuse_max: int | None = None,
              launcher: str | None = None) -> SweepReport:
    """Plan and execute a sweep; returns its report. Bad input raises ConfigError before any run starts.

    engine: "papermill" (default for local and dask: executes the spec's notebook per run) or "library"
    (calls train.run; the only engine of the inline executor). timeout overrides the spec's per-run timeout
    (not enforced by the inline executor, which runs in this process).
    fuse: "auto" trains pending runs that can fuse in groups of at most fuse_max (default: 32 on a CPU, and
    on CUDA what the memory model says fits); "off" runs each alone, as before fused runs existed.
    runs_root: where the run directories go (relative: to the working directory); by default runs/ of the project
    that holds the spec (runs_folder), whatever the working directory. Every run's code (a model or dataset
    factory, a notebook of one's own), and the check before the sweep, runs from that project's root.
    launcher: how each run on several devices starts its processes ("processes" or "srun", bsresearch.devices.launcher;
    default: $BSRESEARCH_DEVICE_LAUNCHER, else processes); the tasks carry it to their workers. srun is
    checked here (a Slurm allocation, srun on the PATH) unless the runs go to a remote Dask cluster, whose
    workers are where the steps start.
    """
    spec = spec if isinstance(spec, SweepSpec) else load_spec(spec)
    if not spec.has_runs:
        raise ConfigError(f"spec {spec.name!r} defines no runs (no base, grid or variants): it is analysis-only; "
                          f"use `bsresearch report {spec.path or spec.name}`")
    engine = engine or ("library" if executor == "inline" else "papermill")
    _check_options(spec, executor, engine, workers, timeout)
    if spec.own is not None:
        fuse = "off"   # a notebook of one's own trains one run per kernel
    _check_fuse(fuse, fuse_max, engine)
    if cluster and workers is None:
        raise ConfigError(f"--cluster {cluster} needs --workers N: the number of batch jobs to submit")
    if executor == "dask":
        check_dask(scheduler, cluster)  # before sweep.json is written
    remote = executor == "dask" and (scheduler or cluster)
    launcher = check_launcher(launcher or device_launcher(), here=not remote)
    points = expand(spec)
    home = spec.project
    with working_directory(home):   # where the workers run the same code (RunTask.cwd)
        streamed = None if remote else check_data(points)  # a remote cluster may see data this machine does not
    sweep_dir = runs_folder(spec, runs_root) / spec.name
    planned = plan(points, sweep_dir, retry_failed)
    todo = [p for p in planned if p.action == "run"]
    gpus = () if remote else visible_gpus()
    devices = max((p.point.devices for p in todo), default=1)
    slurm_tasks = allocation_tasks() if launcher == "srun" and not remote else None
    workers = workers or (max(1, min(len(todo), slurm_tasks // devices)) if slurm_tasks
                          else default_workers(len(todo), gpus, devices))
    notebook = run_template(spec) if engine == "papermill" else spec.notebook
    if fuse == "auto":
        planned = assign_groups(planned, workers, fuse_max, engine, notebook, gpus, streamed=streamed)
        todo = [p for p in planned if p.action == "run"]
    per_run = float(timeout or spec.timeout)
    tasks = make_tasks(todo, sweep_dir, engine, str(notebook) if notebook else None, per_run, gpus, launcher,
                       cwd=str(home))
    if executor != "dask" and len(tasks) < len(todo):  # fused: fewer tasks than runs, no idle slots
        workers = max(1, min(workers, len(tasks)))
    start = time.monotonic()
    if not dry_run:
        check_writable(sweep_dir, "--runs")
        write_manifest(spec, sweep_dir, points)
        make_reserve(sweep_dir)   # room for the statuses that say the disk filled (rundir.RESERVE)
    dispatch = tuple(tuple(m.run_id for m in t.members) if isinstance(t, GroupTask) else (t.run_id,) for t in tasks)
    if dry_run or not todo:
        waited = () if dry_run else wait_for_others([p for p in planned if p.action == BUSY], progress)
        return SweepReport(spec, sweep_dir, executor, engine, workers, tuple(planned), (), 0.0, dry_run, waited,
                           fuse, dispatch, launcher)
    fn = execute if executor == "inline" else supervise.run_any
    window = {"inline": 1, "local": workers}.get(executor, len(tasks))
    outcomes: list[RunOutcome] = []
    bar = _progress_bar(len(todo), progress, spec.name)
    lines = progress is None and bar.disable   # no terminal to draw a bar on (a log, a pipe): a line per run
    supervise.start_accepting()
    try:
        with launcher_environment(launcher), \
                make_executor(executor, workers, scheduler, cluster, cluster_options) as pool:
            try:
                for task, future in _completed(pool, fn, tasks, window):
                    done = _outcomes(task, future)
                    outcomes.extend(done)
                    if lines:
                        for o in done:
                            print(progress_line(o, len(outcomes) - len(done) + done.index(o) + 1, len(todo),
                                                time.monotonic() - start), file=sys.stderr, flush=True)
                    bar.update(len(done))
                    bar.set_postfix_str(" ".join(f"{k} {v}" for k, v in
                                                 sorted(Counter(o.state for o in outcomes).items())))
            except KeyboardInterrupt:  # stop the workers before the executor waits for them; their runs
                supervise.stop_all()   # stay "running" with no lock held, and are redone next time
                raise
    finally:
        bar.close()
    busy = {o.run_id for o in outcomes if o.state == BUSY}
    waited = wait_for_others([p for p in planned if p.action == BUSY or p.point.run_id in busy], progress)
    return SweepReport(spec, sweep_dir, executor, engine, workers, tuple(planned), tuple(outcomes),
                       time.monotonic() - start, waited=waited, fuse=fuse, dispatch=dispatch, launcher=launcher)


def wait_for_others(runs: list[PlannedRun], progress: bool | None = None,
                    poll: float = 0.5) -> tuple[RunOutcome, ...]:
    """Wait until no live process holds these runs' locks (another sweep of the same spec is running them),
    then read what each recorded: a run that process finished counts as done here too. A run it left
    behind (killed) reads "interrupted"."""
    if runs and (sys.stderr.isatty() if progress is None else progress):
        print(f"waiting for {len(runs)} run(s) that another process is running", file=sys.stderr)
    out = []
    for p in runs:
        while is_locked(p.run_dir):
            time.sleep(poll)
        rd = RunDir(p.run_dir)
        state = rd.state()
        if state in (None, "running") or (state in FINISHED_STATES and not is_complete(p.run_dir)):
            state = "interrupted"
        error = (rd.status() or {}).get("error")
        out.append(RunOutcome(p.point.run_id, p.point.label, state, None if error is None else str(error)))
    return tuple(out)




def make_tasks(todo: list[PlannedRun], sweep_dir: Path, engine: str, notebook: str | None, timeout: float,
               gpus: tuple[str, ...], launcher: str | None = None, cwd: str | None = None) -> list[RunTask | GroupTask]:
    """One RunTask per run left alone, one GroupTask per fused group, in the order they are dispatched: the
    longest estimated first (cost.task_seconds from the configs; equal estimates keep the spec's order, a
    group at its first member's place), so that the last tasks to start are short and no worker waits long
    for the others at the end. Only the order changes: run ids, run directories and results do not.

    A group's timeout is the per-run timeout times its members: together they may take as long as they
    would have one after another, never less than one of them alone. `launcher` travels with each run's task
    (a fused group trains on one device and needs none). `cwd`: the folder every run's code runs from (the
    spec's project). The runs of a notebook of one's own carry its parameters, and cost alike (no estimate)."""
    def run_task(p: PlannedRun) -> RunTask:
        return RunTask(run_dir=str(p.run_dir), config=p.point.task_config, label=p.point.label, engine=engine,
                       notebook=notebook, timeout=timeout, gpus=gpus, launcher=launcher,
                       own_notebook=p.point.config is None, cwd=cwd)

    tasks: list[RunTask | GroupTask] = []
    members: dict[str, list[RunTask]] = {}
    configs: list[list[RunConfig | None]] = []   # per task, its runs' configs (for the estimate)
    place: dict[str, int] = {}            # group id -> its task's index
    for p in todo:
        if p.group is None:
            tasks.append(run_task(p))
            configs.append([p.point.config])
        elif p.group not in members:
            members[p.group], place[p.group] = [run_task(p)], len(tasks)
            tasks.append(GroupTask(group_id=p.group, group_dir="", members=()))  # filled in below
            configs.append([p.point.config])
        else:
            members[p.group].append(run_task(p))
            configs[place[p.group]].append(p.point.config)
    tasks = [GroupTask(group_id=t.group_id, group_dir=str(sweep_dir / GROUPS_DIR / t.group_id),
                       members=tuple(members[t.group_id]), engine=engine, notebook=str(GROUP_TEMPLATE),
                       timeout=timeout * len(members[t.group_id]), gpus=gpus, cwd=cwd)
             if isinstance(t, GroupTask) else t for t in tasks]
    return longest_first(tasks, [task_seconds([c for c in cs if c is not None]) if None not in cs else 0.0
                                 for cs in configs])


def _check_fuse(fuse: str, fuse_max: int | None, engine: str) -> None:
    if fuse not in FUSE_MODES:
        raise ConfigError(f"fuse must be one of {', '.join(FUSE_MODES)}; got {fuse!r}")
    if fuse_max is not None and (isinstance(fuse_max, bool) or not isinstance(fuse_max, int) or fuse_max < 1):
        raise ConfigError(f"fuse_max must be a positive integer (1: no run is fused); got {fuse_max!r}")
    if fuse == "auto" and engine == "papermill" and not GROUP_TEMPLATE.exists():
        raise ConfigError(f"--fuse auto with papermill needs the group template {GROUP_TEMPLATE}, which is "
                          "missing; use --fuse off or --engine library")


def run_template(spec: SweepSpec) -> Path:
    """The notebook papermill executes for each run: the spec's `notebook:`, else the packaged run template."""
    if spec.notebook is not None:
        return spec.notebook
    try:
        return templates.notebook(templates.RUN_TEMPLATE)
    except FileNotFoundError as exc:
        raise ConfigError(f"notebook: spec {spec.name!r} names no run template and {exc}; name one with "
                          f"'notebook: PATH.ipynb', or use --engine library") from None


def _check_options(spec: SweepSpec, executor: str, engine: str, workers: int | None, timeout: float | None) -> None:
    if engine not in ("papermill", "library"):
        raise ConfigError(f"engine must be papermill or library; got {engine!r}")
    if executor == "inline" and engine != "library":
        raise ConfigError("the inline executor calls the library in this process; use --executor local "
                          "(or dask) to execute notebooks with papermill")
    if engine == "papermill" and importlib.util.find_spec("papermill") is None:
        raise ConfigError("the papermill engine needs papermill (pip install papermill), or use --engine library")
    if engine == "papermill":
        run_template(spec)   # a wheel installed without its notebooks: say so before any work
    if spec.own is not None and engine != "papermill":
        what = "the inline executor calls train.run in this process" if executor == "inline" else \
            "--engine library calls train.run"
        raise ConfigError(f"{what} on a RunConfig; {spec.own.path.name} is a training notebook of your own, which "
                          f"runs through papermill: use --executor local or dask without --engine library")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be a positive integer; got {workers}")
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds; got {timeout}")


def _completed(pool: Executor, fn: Callable[[Any], list[RunOutcome]], tasks: list[RunTask | GroupTask],
               window: int) -> Iterator[tuple[RunTask | GroupTask, Future]]:
    """Submit tasks keeping at most `window` in flight; yield each (task, future) as it completes."""
    queue = iter(tasks)
    pending: dict[Future, RunTask | GroupTask] = {}

    def fill() -> None:
        while len(pending) < window:
            task = next(queue, None)
            if task is None:
                return
            pending[pool.submit(fn, task)] = task

    fill()
    while pending:
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            yield pending.pop(future), future
        fill()


def _outcomes(task: RunTask | GroupTask, future: Future) -> list[RunOutcome]:
    """The future's outcomes (one per run); an exception (a bug, or Dask giving up on a killed worker) is
    recorded as "died" in the status of each run nobody holds."""
    try:
        return list(future.result())
    except Exception as exc:  # noqa: BLE001 - one task's problem, the sweep goes on
        error = f"{type(exc).__name__}: {exc}"
        out = []
        for run in task.members if isinstance(task, GroupTask) else (task,):
            rd = RunDir(run.run_dir)
            try:
                if not is_locked(rd.path) and rd.state() not in FINISHED_STATES:
                    rd.write_status("died", error=error)
            except OSError as write_error:  # a read-only or full disk: the report below still says it
                if not storage_error(write_error):
                    raise
            out.append(RunOutcome(run.run_id, run.label, "died", error))
        return out


def progress_line(outcome: RunOutcome, n: int, total: int, elapsed: float) -> str:
    """The line a sweep prints for each finished run when its output is not a terminal: its place, state,
    label and seconds, and the sweep's time so far
    (e.g. `[3/9] ok batch_size=32 seed=0 (1a2b3c4d5e): 12.3 s, 41 s into the sweep`)."""
    why = f" ({outcome.error.splitlines()[0][:200]})" if outcome.error and outcome.state != "ok" else ""
    return (f"[{n}/{total}] {outcome.state} {outcome.label} ({outcome.run_id}): {outcome.seconds:.1f} s{why}, "
            f"{elapsed:.0f} s into the sweep")


def _progress_bar(total: int, enabled: bool | None, name: str):
    from tqdm.auto import tqdm
    return tqdm(total=total, unit="run", desc=name, dynamic_ncols=True, leave=True,
                disable=not (sys.stderr.isatty() if enabled is None else enabled))
