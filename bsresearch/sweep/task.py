"""One run of a sweep as data (RunTask, RunOutcome), the per-run lock, and process bookkeeping.

No torch import. A RunTask is plain data: it is pickled to Dask workers and sent as JSON to the
worker process that executes it.

Who runs a run is decided by an exclusive `flock` on `<run_dir>/.lock`, held by the process that
executes it for as long as it does. The operating system drops the lock when that process dies, however
it dies (kill -9 included), so "status running and the lock free" means "left behind by a dead process":
such a run is redone. A lock held by a live process means someone else is running it: it is not touched.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..rundir import FINISHED_STATES, RunDir

try:
    import fcntl
except ImportError:  # Windows: no locking (runs there are not protected against a concurrent sweep)
    fcntl = None  # type: ignore[assignment]

ENGINES = ("papermill", "library")
LOCK_NAME = ".lock"
PARTIAL_NOTEBOOK = ".run.partial.ipynb"   # papermill writes here; renamed to run.ipynb when it ends
# papermill's kernel arguments: its "running over TCP without encryption" warning is noise for a kernel
# that listens on 127.0.0.1 only (cell output is unaffected)
RUNNER_LOG = "runner.log"                 # the worker's and the kernel's output, appended per attempt
BUSY = "busy"                             # outcome (not a run state): another live process holds the lock


@dataclass(frozen=True)
class RunTask:
    """Everything a worker needs to execute one run; JSON-able and picklable."""
    run_dir: str                      # absolute path of the run directory
    config: dict[str, Any]            # RunConfig.to_dict()
    label: str                        # "batch_size=32 seed=0", for people
    engine: str = "papermill"         # papermill: execute the run template notebook; library: call train.run
    notebook: str | None = None       # the run template (absolute path), for the papermill engine
    timeout: float = 3600.0           # seconds for the whole run; then it is killed and recorded "timeout"
    gpus: tuple[str, ...] = ()        # CUDA_VISIBLE_DEVICES values to spread over worker slots (local only)
    kernel: str = "python3"           # Jupyter kernel name for papermill
    launcher: str | None = None       # how a run on several devices starts its processes (devices/launcher.py); the
                                      # worker's environment gets it; None: the worker's environment decides
    own_notebook: bool = False        # `notebook` is a training notebook of one's own: `config` holds the values
                                      # for its parameters cell (not a RunConfig), and it writes the run itself
    cwd: str | None = None            # the folder the run's code runs from (the spec's project root); None: the
                                      # run directory (papermill) or the worker's working directory (library)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunTask:
        d = json.loads(text)
        d["gpus"] = tuple(d.get("gpus", ()))
        return cls(**d)

    @property
    def run_id(self) -> str:
        return Path(self.run_dir).name


@dataclass(frozen=True)
class GroupTask:
    """Runs trained together as one fused group (bsresearch.fused): one task for every executor.

    The worker locks every member's run directory; members finished (or held by another process) are
    left alone. The group's executed notebook and its runner log live in `group_dir`
    (RUNS/<sweep>/groups/<group_id>/); each member's results stay in its own run directory.
    """
    group_id: str
    group_dir: str                    # absolute path
    members: tuple[RunTask, ...]
    engine: str = "papermill"         # papermill: execute the group template; library: call train_group
    notebook: str | None = None       # the group template (absolute path), for the papermill engine
    timeout: float = 3600.0           # seconds for the whole group
    gpus: tuple[str, ...] = ()
    kernel: str = "python3"
    cwd: str | None = None            # the folder the members' code runs from (the spec's project root)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GroupTask:
        d = json.loads(text)
        d["members"] = tuple(RunTask(**{**m, "gpus": tuple(m.get("gpus", ()))}) for m in d["members"])
        d["gpus"] = tuple(d.get("gpus", ()))
        return cls(**d)

    @property
    def run_id(self) -> str:
        return self.group_id

    @property
    def label(self) -> str:
        return f"group {self.group_id} ({len(self.members)} runs)"

    @property
    def config(self) -> dict[str, Any]:
        """The first member's config: threads and device, which every member shares."""
        return self.members[0].config


def task_from_json(text: str) -> RunTask | GroupTask:
    """A RunTask or a GroupTask (it has members) from its JSON."""
    return GroupTask.from_json(text) if "members" in json.loads(text) else RunTask.from_json(text)


@dataclass(frozen=True)
class RunOutcome:
    """What became of one run: a run state (ok, failed, diverged, oom, timeout, died) or 'busy'."""
    run_id: str
    label: str
    state: str
    error: str | None = None
    seconds: float = 0.0              # wall time of this attempt, as seen by whoever reports it
    notebook_error: str | None = None  # a notebook cell failed after (or without) affecting the run
    elsewhere: bool = False           # finished by another process after this sweep planned it: not executed here


def is_complete(run_dir: str | Path) -> bool:
    """Finished (ok or diverged) and no notebook left half-executed: nothing more to do for this run.

    A run killed after training but before its notebook's last cells (plots) ran is finished but not
    complete: its notebook is executed again, and train.run returns the finished result without training.
    """
    return RunDir(run_dir).is_finished() and not (Path(run_dir) / PARTIAL_NOTEBOOK).exists()


def outcome_from_status(task: RunTask, seconds: float, executor: tuple[str, int] | None = None) -> RunOutcome:
    """The outcome as recorded in the run's status.json (the single source of truth).

    `executor`: (host, pid) of the worker process that was to execute the run. A finished run whose status
    names another runner was finished by another process (another sweep of the same spec) after this sweep
    planned it: its outcome says so (`elsewhere`), and the sweep does not count it as executed."""
    status = RunDir(task.run_dir).status() or {}
    error = status.get("error")
    runner = status.get("runner") or {}
    state = status.get("state") or "failed"
    elsewhere = (executor is not None and state in FINISHED_STATES
                 and (runner.get("host"), runner.get("pid")) != executor)
    return RunOutcome(task.run_id, task.label, state, error=None if error is None else str(error), seconds=seconds,
                      notebook_error=status.get("notebook_error"), elsewhere=elsewhere)


def worker_identity(pid: int | None = None) -> tuple[str, int]:
    """(host, pid) of a worker process on this host (this process by default): what a worker records of
    itself in a run's status ("runner") and what outcome_from_status compares it with."""
    return socket.gethostname(), os.getpid() if pid is None else pid


# ----------------------------------------------------------------------------- the run lock
@contextlib.contextmanager
def run_lock(run_dir: str | Path, wait: float = 0.0) -> Iterator[bool]:
    """Try to take the run's lock, for up to `wait` seconds; yields True when held (released on exit or death)."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield True
        return
    fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.1)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def is_locked(run_dir: str | Path) -> bool:
    """Whether a live process holds the run's lock now (a run directory without a lock file is free)."""
    if fcntl is None or not (Path(run_dir) / LOCK_NAME).exists():
        return False
    with run_lock(run_dir) as held:
        return not held


# ----------------------------------------------------------------------------- processes
def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host (zombies count as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not collected it yet
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Poll until process `pid` is gone; True if it went within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), from Linux /proc; None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def recorded_pid(run_dir: str | Path) -> int | None:
    """The process that is (or was) training the run, as train.run recorded it in a "running" status, if it
    ran on this host; None when that process has gone (or its pid now belongs to a newer process)."""
    status = RunDir(run_dir).status() or {}
    prov = status.get("provenance") or {}
    pid = prov.get("pid")
    if status.get("state") != "running" or prov.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    if pid == os.getpid() or not pid_alive(pid):
        return None
    started = process_start_time(pid)
    try:
        updated = datetime.strptime(status["updated"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except (KeyError, ValueError):
        return pid
    return None if started is not None and started > updated + 2 else pid  # +2: clock tick rounding


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc; empty elsewhere)."""
    out: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def kill_children() -> None:
    """SIGKILL this process's children (the papermill kernel), so a stopped worker leaves nothing running. A
    Slurm job step's srun (a run of the library engine under the srun launcher) gets SIGTERM instead, which it
    forwards to the step's tasks on every node: killed, it could not stop them."""
    for pid in child_pids(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM if _command_name(pid) == "srun" else signal.SIGKILL)


def _command_name(pid: int) -> str | None:
    """The name of process `pid`'s program (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the process (thread) that started it dies.

    This is what makes `kill -9` of a sweep stop its workers too; the papermill kernel, in turn, exits
    within a second of its worker (ipykernel polls its parent). A no-op on other systems.
    """
    expected = os.environ.get("BSRESEARCH_SUPERVISOR_PID")
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if expected and os.getppid() != int(expected):  # the parent died before prctl took effect
        os._exit(1)


def clear_partial_files(run_dir: str | Path) -> None:
    """Remove what a killed attempt can leave: temporary files of atomic writes and a partial notebook."""
    path = Path(run_dir)
    for tmp in path.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()
    with contextlib.suppress(OSError):
        (path / PARTIAL_NOTEBOOK).unlink()
