"""Where runs execute: all behind `concurrent.futures.Executor`, so one runner drives them all.

- inline: in this process, one run after another, calling the library (debugging, tests, notebooks);
- local:  N worker slots on this machine; each run is its own worker process (supervise.run_task);
- dask:   a Dask LocalCluster (processes, one thread each), an existing scheduler by address, or a
          Slurm/PBS cluster through dask-jobqueue. Run directories must then be on a filesystem the
          workers share.
"""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from ..config import ConfigError
from .supervise import set_slot

EXECUTORS = ("inline", "local", "dask")
CLUSTERS = ("slurm", "pbs")
SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")  # Dask's network protocols
SCHEDULER_CONNECT_TIMEOUT = 5.0  # seconds to wait for a scheduler's port to answer before the sweep starts
# Defaults for one dask-jobqueue job: one worker process with one thread (each run then starts its own
# worker process); override any of them with --cluster-option KEY=VALUE.
JOBQUEUE_DEFAULTS: dict[str, Any] = {
    "cores": 1, "processes": 1, "memory": "4GB", "walltime": "04:00:00",
    "job_script_prologue": ["export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1"],
}


class InlineExecutor(Executor):
    """Runs each submitted call at once, in the calling thread; returns a completed Future."""

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            if isinstance(exc, KeyboardInterrupt):
                raise
            future.set_exception(exc)
        return future


def local_executor(workers: int) -> ThreadPoolExecutor:
    """`workers` slots; a slot is a thread that starts one worker process per run and waits for it."""
    counter = itertools.count()
    lock = threading.Lock()

    def init() -> None:
        with lock:
            set_slot(next(counter))

    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bsresearch-slot", initializer=init)


def visible_gpus() -> tuple[str, ...]:
    """GPU ids this process may use, without importing torch: CUDA_VISIBLE_DEVICES, else nvidia-smi -L."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = tuple(v.strip() for v in visible.split(",") if v.strip())
        return () if ids in ((), ("-1",)) else ids
    if not shutil.which("nvidia-smi"):
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(str(i) for i, _ in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU ")))


def default_workers(n_runs: int, gpus: tuple[str, ...], devices: int = 1) -> int:
    """One worker per GPU, else one per CPU core this process may use, each run taking `devices` of them (a run on
    several devices: one process per device); never more than the runs."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, min(n_runs, (len(gpus) or cores) // max(1, devices)))


def check_dask(scheduler: str | None = None, cluster: str | None = None,
               timeout: float = SCHEDULER_CONNECT_TIMEOUT) -> None:
    """Everything the dask executor needs, checked before anything is written: dask installed, a
    well-formed --scheduler address with something listening at it, a known --cluster kind."""
    if importlib.util.find_spec("distributed") is None:
        raise ConfigError("executor 'dask' needs dask[distributed]: pip install -e '.[dask]'")
    if scheduler and cluster:
        raise ConfigError("give either --scheduler ADDRESS or --cluster KIND, not both")
    if cluster is not None:
        if cluster not in CLUSTERS:
            raise ConfigError(f"cluster must be one of {', '.join(CLUSTERS)}; got {cluster!r}")
        if importlib.util.find_spec("dask_jobqueue") is None:
            raise ConfigError("--cluster needs dask-jobqueue: pip install -e '.[dask]'")
    if scheduler is not None:
        check_scheduler(scheduler, timeout)


def check_scheduler(address: str, timeout: float = SCHEDULER_CONNECT_TIMEOUT) -> None:
    """A Dask scheduler address, [SCHEME://]HOST:PORT, that something answers at within `timeout` seconds;
    ConfigError otherwise (a malformed address, an unknown host, nothing listening, no answer)."""
    m = re.fullmatch(r"(?:(?P<scheme>[A-Za-z]+)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d+)/?",
                     address.strip())
    scheme = (m.group("scheme") or "tcp").lower() if m else None
    if m is None or scheme not in SCHEDULER_SCHEMES or not 0 < int(m.group("port")) < 65536:
        raise ConfigError(f"--scheduler must be a Dask scheduler address [SCHEME://]HOST:PORT, e.g. "
                          f"tcp://head:8786 (schemes: {', '.join(SCHEDULER_SCHEMES)}; port 1-65535); got {address!r}")
    if scheme == "ucx":  # not a TCP port to knock on; Dask reports a bad one itself
        return
    host, port = m.group("host").strip("[]"), int(m.group("port"))
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except TimeoutError:
        raise ConfigError(f"--scheduler {address}: no answer within {timeout:g} s (is the scheduler running, "
                          f"and the port open from here?)") from None
    except socket.gaierror as exc:
        raise ConfigError(f"--scheduler {address}: unknown host {host!r} ({exc.strerror})") from None
    except OSError as exc:
        raise ConfigError(f"--scheduler {address}: nothing listens there ({exc.strerror or exc}); start one "
                          f"with `dask scheduler`, or check the address") from None


@contextlib.contextmanager
def make_executor(kind: str, workers: int, scheduler: str | None = None, cluster: str | None = None,
                  cluster_options: dict[str, Any] | None = None) -> Iterator[Executor]:
    """An Executor of the given kind, shut down (and its cluster closed) on exit."""
    if kind not in EXECUTORS:
        raise ConfigError(f"executor must be one of {', '.join(EXECUTORS)}; got {kind!r}")
    if kind == "inline":
        yield InlineExecutor()
    elif kind == "local":
        with local_executor(workers) as executor:
            yield executor
    else:
        with dask_client(workers, scheduler, cluster, cluster_options) as client:
            yield client.get_executor(pure=False)


@contextlib.contextmanager
def dask_client(workers: int, scheduler: str | None = None, cluster: str | None = None,
                cluster_options: dict[str, Any] | None = None) -> Iterator[Any]:
    """A distributed.Client: to `scheduler`, to a new jobqueue `cluster` of `workers` jobs, or to a new
    LocalCluster of `workers` processes with one thread each."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ConfigError("executor 'dask' needs dask[distributed]: pip install -e '.[dask]'") from None
    if scheduler and cluster:
        raise ConfigError("give either --scheduler ADDRESS or --cluster KIND, not both")
    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    if cluster:
        with jobqueue_cluster(cluster, cluster_options) as jq:
            jq.scale(jobs=workers)
            with Client(jq) as client:
                yield client
        return
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0") as lc:
        with Client(lc) as client:
            yield client


def jobqueue_cluster(kind: str, options: dict[str, Any] | None = None) -> Any:
    """A dask-jobqueue SLURMCluster or PBSCluster (not yet scaled): JOBQUEUE_DEFAULTS updated by `options`.

    Useful options: queue, account, memory, walltime, job_extra_directives (e.g. ["--gres=gpu:1"]),
    job_script_prologue (e.g. ["module load cuda", "source .venv/bin/activate"]).
    """
    if kind not in CLUSTERS:
        raise ConfigError(f"cluster must be one of {', '.join(CLUSTERS)}; got {kind!r}")
    try:
        import dask_jobqueue
    except ImportError:
        raise ConfigError("--cluster needs dask-jobqueue: pip install -e '.[dask]'") from None
    cls = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster}[kind]
    kwargs = {**JOBQUEUE_DEFAULTS, "scheduler_options": {"dashboard_address": None}, **(options or {})}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # an option dask-jobqueue does not know
        raise ConfigError(f"--cluster-option: {str(exc).splitlines()[0]}") from None


def job_script(kind: str, options: dict[str, Any] | None = None) -> str:
    """The batch script one worker job would be submitted with (nothing is submitted)."""
    with jobqueue_cluster(kind, options) as cluster:
        return cluster.job_script()
