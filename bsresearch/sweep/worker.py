"""Execute one RunTask in this process: take the run's lock, run it (papermill or the library), and write
the runner's own verdict into status.json.

`python -m bsresearch.sweep` (__main__.py) reads a RunTask as JSON on stdin and executes it; the supervisor
(supervise.py) starts one such process per run, so a crash, a timeout or a kill takes down one run only.
The inline executor calls `execute_task` directly.

Why the runner writes its own status: papermill's verdict is not enough. `sys.exit(0)` in a cell stops
the notebook and papermill reports success; a cell timeout and a dead kernel raise exceptions that are
not cell errors; an error in a plotting cell after a finished run is not a failed run. So the state is
taken from the run's status.json (written by train.run), corrected with what the runner saw:
- training finished (ok, diverged, failed, oom): that state stands; a later notebook problem is kept
  as `notebook_error`;
- training did not finish: "timeout" (a cell ran past the timeout), "died" (the kernel died), or
  "failed" (a cell raised, or the notebook ended early) with the reason as the error.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..config import RunConfig
from ..paths import working_directory
from ..rundir import RunDir, atomic_write_bytes
from .kernels import execute_notebook
from .task import (
    BUSY,
    PARTIAL_NOTEBOOK,
    GroupTask,
    RunOutcome,
    RunTask,
    clear_partial_files,
    die_with_parent,
    is_complete,
    kill_children,
    outcome_from_status,
    recorded_pid,
    run_lock,
    task_from_json,
    wait_for_exit,
    worker_identity,
)

PREVIOUS_OWNER_WAIT = 15.0  # seconds to wait for a process left over from a killed attempt to exit
# Seconds to wait for a run's lock before calling it busy: a worker killed with SIGKILL (a lost Dask worker)
# takes its run process with it (task.die_with_parent), but that process lets go of the lock only once it has
# exited, which a loaded machine can take seconds to do, while the run's task is already rescheduled elsewhere.
LOCK_WAIT = 10.0
EXIT_BUSY = 75              # worker exit status when another live process holds the run's lock


def execute_task(task: RunTask) -> RunOutcome:
    """Run `task` in this process unless it is finished or locked; the verdict is in status.json."""
    start = time.monotonic()
    rd = RunDir(task.run_dir)
    with run_lock(rd.path, LOCK_WAIT) as held:
        if not held:
            return RunOutcome(task.run_id, task.label, BUSY, "another live process is running it")
        if is_complete(rd.path) or (task.own_notebook and rd.is_finished()):  # completed by someone else
            return outcome_from_status(task, 0.0, worker_identity())                  # since the sweep planned it
        leftover = recorded_pid(rd.path)
        if leftover and not wait_for_exit(leftover, PREVIOUS_OWNER_WAIT):
            return RunOutcome(task.run_id, task.label, BUSY,
                              f"process {leftover} from an earlier attempt is still running")
        trained = rd.is_finished()  # only the notebook's last cells were cut short: the training stands
        clear_partial_files(rd.path)
        previous = (rd.status() or {}).get("runner") or {}
        host, pid = worker_identity()
        runner = {"engine": task.engine, "host": host, "pid": pid,
                  "attempt": int(previous.get("attempt", 0)) + 1, "timeout_s": task.timeout}
        if trained:
            rd.write_status(str(rd.state()), notebook_error=None, runner=runner)
        else:
            rd.write_status("running", error=None, traceback=None, notebook_error=None, runner=runner,
                            provenance=None)  # train.run records this attempt's process in it
        if task.engine == "papermill":
            _run_papermill(task, rd)  # on a trained run, train.run returns the result without training
        elif not trained:
            _run_library(task, rd)
    return outcome_from_status(task, time.monotonic() - start)


def execute(task: RunTask | GroupTask) -> list[RunOutcome]:
    """Execute a run or a fused group in this process; one outcome per run."""
    return execute_group(task) if isinstance(task, GroupTask) else [execute_task(task)]


def execute_group(task: GroupTask) -> list[RunOutcome]:
    """Train the group's members together, holding every member's lock; members finished or held by
    another process are left alone. Each member's verdict is in its status.json, as for a single run."""
    start = time.monotonic()
    outcomes: dict[str, RunOutcome] = {}
    todo: list[RunTask] = []
    host, pid = worker_identity()
    with contextlib.ExitStack() as locks:
        for member in task.members:
            rd = RunDir(member.run_dir)
            if not locks.enter_context(run_lock(rd.path, LOCK_WAIT)):
                outcomes[member.run_id] = RunOutcome(member.run_id, member.label, BUSY,
                                                     "another live process is running it")
            elif rd.is_finished():  # finished by someone else since the sweep was planned
                outcomes[member.run_id] = outcome_from_status(member, 0.0, (host, pid))
            else:
                leftover = recorded_pid(rd.path)
                if leftover and not wait_for_exit(leftover, PREVIOUS_OWNER_WAIT):
                    outcomes[member.run_id] = RunOutcome(member.run_id, member.label, BUSY,
                                                         f"process {leftover} from an earlier attempt is still running")
                    continue
                clear_partial_files(rd.path)
                previous = (rd.status() or {}).get("runner") or {}
                rd.write_status("running", error=None, traceback=None, notebook_error=None, provenance=None,
                                group=task.group_id, group_dir=task.group_dir,
                                runner={"engine": task.engine, "host": host, "pid": pid,
                                        "attempt": int(previous.get("attempt", 0)) + 1, "timeout_s": task.timeout})
                todo.append(member)
        if todo:
            Path(task.group_dir).mkdir(parents=True, exist_ok=True)
            if task.engine == "papermill":
                _run_group_papermill(task, todo)
            else:
                _run_group_library(task, todo)
        for member in todo:
            outcomes[member.run_id] = outcome_from_status(member, time.monotonic() - start)
    return [outcomes[m.run_id] for m in task.members]


def _run_group_library(task: GroupTask, members: list[RunTask]) -> None:
    from ..fused import train_group  # it splits a chunk that runs out of memory, and records a lone member's oom
    try:
        with working_directory(task.cwd or os.getcwd()):
            train_group([RunConfig.from_dict(m.config) for m in members], [m.run_dir for m in members],
                        progress=False, group_id=task.group_id)
    except Exception as exc:  # noqa: BLE001 - e.g. ConfigError at setup: the members fail, the sweep goes on
        error, trace = f"{type(exc).__name__}: {exc}", traceback.format_exc()
        for m in members:
            if RunDir(m.run_dir).state() == "running":
                RunDir(m.run_dir).write_status("failed", error=error, traceback=trace)
    for m in members:
        if RunDir(m.run_dir).state() == "running":
            RunDir(m.run_dir).write_status("failed", error="train_group returned without finishing the run")


GROUP_NOTEBOOK = "group.ipynb"                 # the executed group template, in the group's directory
PARTIAL_GROUP_NOTEBOOK = ".group.partial.ipynb"


def group_parameters(task: GroupTask, members: list[RunTask]) -> dict[str, object]:
    """What papermill injects into the group template's parameters cell."""
    return {"configs_json": json.dumps([m.config for m in members]), "run_dirs": [m.run_dir for m in members],
            "group_id": task.group_id}


@dataclass(frozen=True)
class NotebookOutcome:
    """What executing a run's (or a group's) notebook came to, beside the run's own status.json."""
    forced: tuple[str, str] | None   # a state the runner knows better than papermill (timeout, died) and why
    problem: str | None              # a notebook error that is not by itself a run state
    failed_starts: list[str]         # kernels that did not start and were started again (kernels.py)


def _execute_notebook(task: RunTask | GroupTask, parameters: dict[str, object], cwd: Path, partial: Path,
                      final: Path, what: str) -> NotebookOutcome:
    """Execute task.notebook with papermill into `partial`, then move it to `final` (also when it fails).
    `what` is "" for a run, "group " for a fused group."""
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    forced: tuple[str, str] | None = None
    problem: str | None = None
    failed_starts: list[str] = []
    assert task.notebook is not None  # the papermill engine's tasks always name their notebook
    try:
        failed_starts = execute_notebook(task.notebook, partial, parameters, cwd, task.kernel, task.timeout,
                                         progress_bar=False, log_output=True, coalesce_streams=True,
                                         shutdown_kernel="immediate")  # files written: a graceful stop takes s
        problem = unfinished_cells(partial)
    except CellTimeoutError:
        forced = ("timeout", f"a notebook cell ran past the {task.timeout:g} s timeout"
                             f"{' of the group' if what else ''}")
    except DeadKernelError:
        forced = ("died", f"the {what}notebook's kernel died (killed, or out of memory)")
    except pm.PapermillExecutionError as exc:
        problem = f"{what + 'notebook ' if what else ''}cell {exc.exec_count}: {exc.ename}: {exc.evalue}"
    except Exception as exc:  # noqa: BLE001 - papermill could not run the notebook at all
        problem = f"papermill: {type(exc).__name__}: {exc}"
    finally:
        if partial.exists():
            os.replace(partial, final)
    return NotebookOutcome(forced, problem, failed_starts)


def _run_group_papermill(task: GroupTask, members: list[RunTask]) -> None:
    group_dir = Path(task.group_dir)
    outcome = _execute_notebook(task, group_parameters(task, members), Path(task.cwd or group_dir),
                                group_dir / PARTIAL_GROUP_NOTEBOOK, group_dir / GROUP_NOTEBOOK, "group ")
    forced, problem = outcome.forced, outcome.problem
    for m in members:
        rd = RunDir(m.run_dir)
        if outcome.failed_starts:
            rd.write_status(str(rd.state()), kernel_start_failures=outcome.failed_starts)
        if (group_dir / GROUP_NOTEBOOK).exists():  # each run directory keeps the notebook that ran it
            atomic_write_bytes(rd.notebook_path, (group_dir / GROUP_NOTEBOOK).read_bytes())
        if rd.state() == "running":
            state, error = forced or ("failed", problem or "the group notebook ended before the run finished")
            rd.write_status(state, error=error, notebook_error=problem)
        elif note := problem or (forced[1] if forced else None):  # trained; the notebook failed afterwards
            rd.write_status(str(rd.state()), notebook_error=note)


def _run_library(task: RunTask, rd: RunDir) -> None:
    from ..runtime import is_out_of_memory
    from ..train import run
    try:
        with working_directory(task.cwd or os.getcwd()):   # the user's factories run from the project root
            run(RunConfig.from_dict(task.config), rd.path, progress=False)
    except Exception as exc:  # noqa: BLE001 - e.g. ConfigError at setup: this run fails, the sweep goes on
        rd.write_status("oom" if is_out_of_memory(exc) else "failed", error=f"{type(exc).__name__}: {exc}",
                        traceback=traceback.format_exc())
    if rd.state() == "running":
        rd.write_status("failed", error="train.run returned without finishing the run")


def _run_papermill(task: RunTask, rd: RunDir) -> None:
    outcome = _execute_notebook(task, {**task.config, "run_dir": str(rd.path)}, Path(task.cwd or rd.path),
                                rd.path / PARTIAL_NOTEBOOK, rd.notebook_path, "")
    forced, problem = outcome.forced, outcome.problem
    if outcome.failed_starts:  # attempts of the machinery, kept beside the run's own verdict
        rd.write_status(str(rd.state()), kernel_start_failures=outcome.failed_starts)

    if rd.state() == "running":  # training did not finish: the runner's verdict
        state, error = forced or ("failed", problem or "the notebook ended before the run finished "
                                  + ("(a cell called sys.exit, or the notebook does not finish its run_dir: "
                                     "RunWriter.finish, or the callback given run_dir)" if task.own_notebook else
                                     "(a cell called sys.exit, or the notebook does not call train.run)"))
        rd.write_status(state, error=error, notebook_error=problem)
    elif note := problem or (forced[1] if forced else None):  # training finished; the notebook failed afterwards
        rd.write_status(str(rd.state()), notebook_error=note)


def unfinished_cells(notebook: Path) -> str | None:
    """The first code cell papermill did not complete (it reports success after sys.exit(0)), or None."""
    nb = json.loads(Path(notebook).read_text())
    for index, cell in enumerate(nb.get("cells", [])):
        status = cell.get("metadata", {}).get("papermill", {}).get("status")
        if cell.get("cell_type") == "code" and status not in (None, "completed"):
            return f"cell {index} did not complete (papermill status {status!r}; did a cell call sys.exit?)"
    return None


def _stop_on_sigterm(run_dir: Path) -> None:
    """On SIGTERM from the supervisor (timeout, Ctrl-C): kill the kernel, keep a copy of the notebook
    executed so far as run.ipynb for inspection, and exit at once. The supervisor records the verdict.
    The half-executed notebook itself stays: it marks the run as not complete (task.is_complete), so a
    run killed after training, while plotting, gets its notebook executed again on the next sweep."""
    def handler(signum: int, frame: object) -> None:
        kill_children()
        partial = run_dir / PARTIAL_NOTEBOOK
        if partial.exists():
            copy = run_dir / ".run.killed.ipynb"
            shutil.copyfile(partial, copy)
            os.replace(copy, run_dir / "run.ipynb")
        os._exit(128 + signum)
    signal.signal(signal.SIGTERM, handler)


def main(text: str | None = None) -> int:
    """A worker process: execute the task `text` (JSON; read from stdin when None). Returns the exit status."""
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stdout)
    task = task_from_json(sys.stdin.read() if text is None else text)
    _stop_on_sigterm(Path(task.group_dir if isinstance(task, GroupTask) else task.run_dir))
    logging.info("worker pid %d on %s: %s (%s)", os.getpid(), socket.gethostname(), task.label, task.engine)
    outcomes = execute(task)  # every failure of the run itself is recorded in its status.json
    for outcome in outcomes:
        logging.info("verdict %s: %s%s", outcome.run_id, outcome.state, f": {outcome.error}" if outcome.error else "")
    return EXIT_BUSY if all(o.state == BUSY for o in outcomes) else 0
