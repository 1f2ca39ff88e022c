"""Run one RunTask in its own worker process, with a deadline; what the local and Dask executors call.

`run_task(task)` starts a worker process, the equivalent of `python -m bsresearch.sweep` fed the task (the same
interpreter as this process, so papermill's kernel "python3" is this environment's Python too): on Linux
forked from this process's fork server, which has already imported torch (forkserver.py), else that command
itself. Then it waits:
- past the task's timeout the worker gets SIGTERM (it kills its kernel and exits), then SIGKILL, and the
  run is recorded as "timeout";
- a worker that dies without recording a verdict (killed, segfault) leaves the run recorded as "died".
The worker dies with its parent (Linux PDEATHSIG): the thread that started it, or the fork server, which
exits with the sweep's process; so killing the sweep stops it.
Threads: the worker's environment asks for the run's `threads` (OMP/MKL), and on a machine with GPUs each
worker slot sees one GPU through CUDA_VISIBLE_DEVICES.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..devices.launcher import VARIABLE as LAUNCHER_VARIABLE
from ..paths import with_this_package
from ..rundir import FINISHED_STATES, RunDir, storage_error
from . import forkserver
from .task import (
    BUSY,
    RUNNER_LOG,
    GroupTask,
    RunOutcome,
    RunTask,
    is_locked,
    outcome_from_status,
    recorded_pid,
    run_lock,
    wait_for_exit,
    worker_identity,
)
from .worker import EXIT_BUSY, LOCK_WAIT, PREVIOUS_OWNER_WAIT

STARTUP_GRACE = 30.0  # seconds added to the run's timeout for starting the worker and its kernel
STOP_GRACE = 10.0     # seconds between SIGTERM and SIGKILL

_slot = threading.local()
Worker = subprocess.Popen | forkserver.Forked  # a worker process, started either way (_start)
_live: set[Worker] = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


def set_slot(index: int) -> None:
    """Mark the calling thread as worker slot `index` (local executor threads call this once)."""
    _slot.index = index


def current_slot() -> int | None:
    """This worker's slot: the local executor's thread index, or a LocalCluster worker's numeric name."""
    index = getattr(_slot, "index", None)
    if index is not None:
        return index
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import get_worker
        name = str(get_worker().name)
    except (ImportError, ValueError):
        return None
    return int(name) if name.isdigit() else None


def slot_gpus(gpus: tuple[str, ...], slot: int, devices: int = 1) -> list[str]:
    """The GPUs of worker slot `slot` whose runs each train on `devices` devices: `devices` consecutive GPUs,
    slot 0 the first ones (a run on several devices needs as many slots' GPUs; runner.default_workers)."""
    return [gpus[(slot * devices + k) % len(gpus)] for k in range(devices)]


def worker_env(task: RunTask | GroupTask, slot: int | None) -> dict[str, str]:
    """The worker's environment: thread counts, one GPU per slot when GPUs were handed out, the device launcher
    the task carries, our pid."""
    env = dict(os.environ)
    threads = int(task.config.get("threads") or 0)
    if threads > 0:  # 0 keeps torch's default
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[var] = str(threads)
    device = str(task.config.get("device", "auto"))
    launcher = getattr(task, "launcher", None)
    if launcher:   # the sweep's choice, wherever the worker runs (a Dask worker's environment included)
        env[LAUNCHER_VARIABLE] = launcher
    # explicit cuda:N is left alone, and so are the GPUs of a Slurm job step's tasks (Slurm binds them)
    if task.gpus and slot is not None and device in ("auto", "cuda") and launcher != "srun":
        env["CUDA_VISIBLE_DEVICES"] = ",".join(slot_gpus(task.gpus, slot, int(task.config.get("devices") or 1)))
    env = with_this_package(env)   # the worker and its kernel import this very bsresearch, installed or not
    env["JUPYTER_PREFER_ENV_PATH"] = "1"  # kernel "python3" from this environment, not a user-wide kernelspec
    env["PYTHONUNBUFFERED"] = "1"
    env["BSRESEARCH_SUPERVISOR_PID"] = str(os.getpid())
    env.pop("JPY_SESSION_NAME", None)  # a sweep started from JupyterLab: its workers show no progress bars
    return env


def run_task(task: RunTask) -> RunOutcome:
    """Execute `task` in a fresh worker process; never raises for a failing run."""
    start = time.monotonic()
    rd = RunDir(task.run_dir)
    code, timed_out, pid = _spawn(task, rd.path)
    seconds = time.monotonic() - start
    if _stopping.is_set():  # the sweep is being stopped: the run is left to be redone, not judged
        return RunOutcome(task.run_id, task.label, "interrupted", "the sweep was stopped", seconds)
    if code == EXIT_BUSY:
        return RunOutcome(task.run_id, task.label, BUSY, "another live process is running it", seconds)
    unwritten = _judge(task, code, timed_out, pid, task.timeout)
    if unwritten:
        return RunOutcome(task.run_id, task.label, "died", unwritten, seconds)
    return outcome_from_status(task, seconds, worker_identity(pid))


def run_group_task(task: GroupTask) -> list[RunOutcome]:
    """Execute a fused group in a fresh worker process; one outcome per member, as `run_task` gives."""
    start = time.monotonic()
    code, timed_out, pid = _spawn(task, Path(task.group_dir))
    seconds = time.monotonic() - start
    if _stopping.is_set():
        return [RunOutcome(m.run_id, m.label, "interrupted", "the sweep was stopped", seconds) for m in task.members]
    outcomes = []
    for member in task.members:
        if code == EXIT_BUSY or is_locked(member.run_dir):  # another live process holds it
            outcomes.append(RunOutcome(member.run_id, member.label, BUSY, "another live process is running it",
                                       seconds))
            continue
        unwritten = _judge(member, code, timed_out, pid, task.timeout, f"of its fused group {task.group_id}")
        outcomes.append(RunOutcome(member.run_id, member.label, "died", unwritten, seconds) if unwritten
                        else outcome_from_status(member, seconds, worker_identity(pid)))
    return outcomes


def run_any(task: RunTask | GroupTask) -> list[RunOutcome]:
    """What the local and Dask executors call: a run or a fused group; one outcome per run."""
    return run_group_task(task) if isinstance(task, GroupTask) else [run_task(task)]


def _spawn(task: RunTask | GroupTask, folder: Path) -> tuple[int, bool, int]:
    """Start the worker process in `folder` (its log appended to folder/runner.log), feed it the task and
    wait; past the timeout stop it. Returns (exit status, timed out, worker pid)."""
    folder.mkdir(parents=True, exist_ok=True)
    proc = _start(task, folder, worker_env(task, current_slot()))
    with _live_lock:
        _live.add(proc)
    timed_out = False
    try:
        try:
            code = proc.wait(timeout=task.timeout + STARTUP_GRACE)
        except subprocess.TimeoutExpired:
            timed_out = True
            code = stop(proc)
    finally:
        with _live_lock:
            _live.discard(proc)
    return code, timed_out, proc.pid


def _start(task: RunTask | GroupTask, folder: Path, env: dict[str, str]) -> Worker:
    """The worker process for `task`: forked from the fork server where it can be (forkserver.py: the same
    process without ~3.5 s of imports), else a fresh `python -m bsresearch.sweep` fed the task on stdin."""
    if forkserver.available(task.gpus):
        try:
            return forkserver.start(task.to_json(), folder, env, folder / RUNNER_LOG)
        except OSError:  # the server could not start or has died: this worker starts as a fresh process
            pass
    with open(folder / RUNNER_LOG, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bsresearch.sweep"], stdin=subprocess.PIPE,
                                stdout=log, stderr=subprocess.STDOUT, cwd=folder, env=env, start_new_session=True)
    try:
        assert proc.stdin is not None
        proc.stdin.write(task.to_json().encode())
        proc.stdin.close()
    except BrokenPipeError:  # the worker is already gone; its exit status says why
        pass
    return proc


def _judge(task: RunTask, code: int, timed_out: bool, worker_pid: int, timeout: float,
           per: str = "per run") -> str | None:
    """Record the supervisor's verdict on a run its worker left unjudged (killed, timed out, crashed). Returns
    None, or, when the disk refused the verdict (full, read-only), the verdict in words for the sweep's report."""
    rd = RunDir(task.run_dir)
    leftover = recorded_pid(rd.path)  # a kernel outliving its worker exits within a second or two
    if leftover and leftover != worker_pid:
        wait_for_exit(leftover, PREVIOUS_OWNER_WAIT)
    try:
        # waited for as a worker waits: a child the killed worker was forking (its provenance's `git`) holds the
        # lock until it execs, which a loaded machine can take a while to do; still not held: another sweep has
        # taken the run over since, and the run is left be
        with run_lock(rd.path, LOCK_WAIT) as held:
            state = rd.state()
            if held and timed_out and state not in FINISHED_STATES:
                rd.write_status("timeout", error=f"killed after the {timeout:g} s timeout {per}")
            elif held and timed_out:  # trained, killed while its notebook was still plotting: redone next time
                rd.write_status(str(state), notebook_error=f"the notebook was killed after the {timeout:g} s "
                                                           f"timeout {per}; the next sweep executes it again")
            elif held and state in (None, "running"):
                rd.write_status("died", error=f"the worker process ended without a verdict "
                                              f"({describe_exit(code)}); see {RUNNER_LOG}")
    except OSError as exc:  # a read-only or full disk: the verdict cannot be written; the sweep's report has it
        if not storage_error(exc):
            raise
        return (f"the worker process ended ({describe_exit(code)}) and the run directory could not be written: "
                f"{exc}")
    return None


def stop(proc: Worker) -> int:
    """SIGTERM, then SIGKILL after a grace period; returns the exit status."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        return proc.wait(timeout=STOP_GRACE)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        return proc.wait()


def start_accepting() -> None:
    """Undo `stop_all` (a new sweep in the same process)."""
    _stopping.clear()


def stop_all() -> None:
    """Stop every worker this process started (Ctrl-C on the sweep); their runs are redone next time."""
    _stopping.set()
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        stop(proc)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"

