"""Starting a run's device processes and judging how they ended.

    run_on_devices(cfg, run_dir)   train.run's path for cfg.devices > 1: join the group the environment gives
                                   (torchrun, a Slurm job step), or start cfg.devices processes as the launcher
                                   says (launcher.py: torch.multiprocessing here, _start_processes, or one Slurm
                                   job step per run, _start_step) and judge how they ended (_judge)
    step_task_main(folder)         one task of a run's Slurm job step (python -m bsresearch.devices FOLDER)

Every device process this package starts leaves a report of how its rank ended (rank<r>.json, _rank_report);
the starting process reads them and the way the group was lost to give the run's result."""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from ..config import ConfigError, RunConfig
from ..driver import before_any_work
from ..loop import Callback, RunResult
from ..paths import with_this_package
from ..rundir import RunDir
from ..runsetup import finished_result
from ..runtime import is_out_of_memory, provenance
from .launcher import allocation_has_gpus, check_launcher, device_launcher
from .place import GroupPlace, group_device, group_from_environment, lost, slurm_place
from .rank import run_rank

JOIN_POLL_SECONDS = 0.2      # how often the starting process looks at its device processes


def _die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when the process that started it dies (no orphaned device
    process)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)   # PR_SET_PDEATHSIG


def _rank_report(place: GroupPlace, cfg: RunConfig, run_dir: str | None, reports: str | Path,
                 progress: bool | None, overwrite: bool, callbacks: Sequence[Callback]) -> None:
    """A device process of a group this package started (either launcher): run its rank, and leave a report of
    how it ended in `reports`/rank<r>.json, which the starting process reads (_read_reports, _judge). Exits 2
    on a ConfigError, 1 unless the run ended ok or diverged."""
    report: dict[str, Any]
    try:
        result = run_rank(cfg, run_dir, place, progress, overwrite, callbacks)
        report = {"state": result.state, "error": result.error}
        if place.rank == 0 and run_dir is None:
            report.update(metrics=result.metrics, history=result.history)
    except ConfigError as exc:
        report = {"config_error": str(exc)}
    except BaseException as exc:
        report = {"state": "died" if lost(exc) else "oom" if is_out_of_memory(exc) else "failed",
                  "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    _write_report(reports, place.rank, report)
    if "config_error" in report:
        raise SystemExit(2)
    if report["state"] not in ("ok", "diverged"):
        raise SystemExit(1)


def _write_report(reports: str | Path, rank: int, report: dict[str, Any]) -> None:
    Path(reports, f"rank{rank}.json").write_text(json.dumps(report, default=str))


def _read_reports(reports: str | Path, devices: int) -> dict[int, dict[str, Any]]:
    """rank -> the report each device process left (_rank_report); a process that left none is missing."""
    return {i: json.loads(p.read_text()) for i in range(devices) if (p := Path(reports, f"rank{i}.json")).exists()}


def _rank_main(index: int, cfg: RunConfig, run_dir: str | None, init_method: str, reports: str,
               progress: bool | None, overwrite: bool, callbacks: Sequence[Callback]) -> None:
    """A device process started by torch.multiprocessing (launcher processes): process `index` of this machine."""
    _die_with_parent()
    _rank_report(GroupPlace(index, cfg.devices, index, init_method), cfg, run_dir, reports, progress, overwrite,
                 callbacks)


def start_method() -> str:
    """forkserver: the device processes are forked from a server process started once per process (it has
    imported this module, so later groups start in a moment), never from the caller, whose threads (a notebook's,
    a progress bar's, a CUDA context) a fork would copy mid-lock. BSRESEARCH_START_METHOD chooses another."""
    method = os.environ.get("BSRESEARCH_START_METHOD") or "forkserver"
    if method == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload([__name__])
    return method


def run_on_devices(cfg: RunConfig, run_dir: str | Path | None = None, progress: bool | None = None,
                   overwrite: bool = False, callbacks: Sequence[Callback] = ()) -> RunResult:
    """train.run for cfg.devices > 1. In a group the environment gives (torchrun, srun), train this process's
    rank; otherwise start cfg.devices processes, one per device, as the launcher (launcher.py) says: with
    torch.multiprocessing here, or as one Slurm job step (srun). Wait for them and return the run's result.
    A process that dies, fails or runs out of memory ends the others and the run: `died` (killed), `oom` or
    `failed`; a finished run directory is never written again.

    With the srun launcher this process is the one that starts the step: the Slurm variables of its own
    allocation (an sbatch script's SLURM_PROCID) do not make it a member of a group."""
    chosen = device_launcher()
    place = group_from_environment(slurm=chosen != "srun")
    if place is not None:
        return run_rank(cfg, run_dir, place, progress, overwrite, callbacks)
    if chosen == "srun":
        check_launcher(chosen)
    finished = before_any_work(cfg, run_dir, overwrite)   # the driver's checks, before any process starts
    if finished is not None:
        return finished
    rd = RunDir(run_dir) if run_dir is not None else None
    start = _start_step if chosen == "srun" else _start_processes
    reports, how_lost, device = start(cfg, rd, progress, overwrite, tuple(callbacks))
    for i in sorted(reports):
        if "config_error" in reports[i]:
            raise ConfigError(reports[i]["config_error"])
    return _judge(cfg, rd, reports, how_lost, device)


def _start_processes(cfg: RunConfig, rd: RunDir | None, progress: bool | None, overwrite: bool,
                     callbacks: tuple[Callback, ...]) -> tuple[dict[int, dict[str, Any]], str | None, torch.device]:
    """Launcher processes: cfg.devices processes of this machine (torch.multiprocessing), watched every
    JOIN_POLL_SECONDS; the first to fail ends the others (SIGTERM, then SIGKILL). Returns their reports, how the
    group was lost (None: every process exited 0) and the device type."""
    device = group_device(cfg, cfg.devices - 1).type   # every process has a device
    with tempfile.TemporaryDirectory(prefix="bsresearch-devices-") as tmp:
        context = mp.start_processes(
            _rank_main, args=(cfg, str(rd.path) if rd else None, f"file://{tmp}/rendezvous", tmp, progress,
                              overwrite, callbacks),
            nprocs=cfg.devices, join=False, start_method=start_method())
        failure: BaseException | None = None
        try:
            while not context.join(JOIN_POLL_SECONDS):
                pass
        except mp.ProcessExitedException as exc:
            failure = exc
        except mp.ProcessRaisedException as exc:
            failure = exc
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                process.join()
        reports = _read_reports(tmp, cfg.devices)
    return reports, _lost_message(failure) if failure is not None else None, torch.device(device)


# ----------------------------------------------------------------------------- one Slurm job step per run
STEP_FILE = "step.pkl"       # in the step's folder: what its tasks train (__main__.py reads it)
STEP_STOP_GRACE = 10.0       # seconds between srun's SIGTERM (it forwards it to the tasks) and SIGKILL


def srun_command(devices: int, gpus: bool, folder: str | Path, name: str = "run", threads: int = 0) -> list[str]:
    """The job step of one run: `devices` tasks of `python -m bsresearch.devices FOLDER`, one GPU each on
    CUDA (none asked for on the CPU), resources of their own (--exclusive: steps side by side never share a
    GPU), and the whole step ended when one task fails (--kill-on-bad-exit)."""
    command = ["srun", "--ntasks", str(devices)]
    if gpus:
        command += ["--gpus-per-task", "1"]
    if threads > 0:
        command += ["--cpus-per-task", str(threads)]
    return [*command, "--exclusive", "--kill-on-bad-exit=1", "--job-name", f"bsresearch-{name}",
            sys.executable, "-m", "bsresearch.devices", str(folder)]


def _step_uses_gpus(cfg: RunConfig) -> bool:
    """Whether the step's tasks train on CUDA: device cuda, or auto where this process sees a GPU or the Slurm
    allocation lists some (the tasks may run on other nodes than this one)."""
    if cfg.device == "cpu":
        return False
    return cfg.device.startswith("cuda") or torch.cuda.is_available() or allocation_has_gpus()


def _start_step(cfg: RunConfig, rd: RunDir | None, progress: bool | None, overwrite: bool,
                callbacks: tuple[Callback, ...]) -> tuple[dict[int, dict[str, Any]], str | None, torch.device]:
    """Launcher srun: the run as one job step of cfg.devices tasks in the current Slurm allocation. The tasks
    meet through a file (torch.distributed's file:// init) in a fresh folder of the run directory (of the working
    directory for a run without one), which every node sees on a cluster's shared filesystem and no other step
    shares; the folder also carries what they train (STEP_FILE) and their reports, and is removed afterwards.
    srun gets SIGTERM (which it forwards to the tasks) if this process dies or is interrupted."""
    gpus = _step_uses_gpus(cfg)
    home = (rd.path if rd else Path.cwd()).resolve()   # absolute: a task's working directory may differ
    home.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".devices-", dir=home))
    try:
        payload = pickle.dumps((cfg, str(home) if rd else None, progress, overwrite, callbacks))
        (folder / STEP_FILE).write_bytes(pickle.dumps({"sys_path": list(sys.path), "payload": payload}))
        env = with_this_package(dict(os.environ))   # the tasks import this very bsresearch
        command = srun_command(cfg.devices, gpus, folder, home.name if rd else "run", cfg.threads)
        proc = subprocess.Popen(command, env=env, preexec_fn=lambda: _die_with_parent(signal.SIGTERM))
        try:
            code = proc.wait()
        finally:
            if proc.poll() is None:   # interrupted: srun forwards SIGTERM to its tasks
                proc.terminate()
                try:
                    proc.wait(timeout=STEP_STOP_GRACE)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        reports = _read_reports(folder, cfg.devices)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    how_lost = None
    if code != 0:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with status {code}"
        silent = [str(i) for i in range(cfg.devices) if i not in reports]
        how_lost = (f"the Slurm job step (srun) {how}" +
                    (f"; device task(s) {', '.join(silent)} ended without a report (killed or lost)" if silent else "")
                    + "; the other tasks were stopped")
    return reports, how_lost, torch.device("cuda" if gpus else "cpu")


def step_task_main(folder: str | Path) -> None:
    """One task of a run's job step (`python -m bsresearch.devices FOLDER`, started by srun): its place
    from Slurm's variables (slurm_place), meeting at FOLDER/rendezvous; then its rank, and its report, as a
    device process of launcher processes does (_rank_report). With one GPU per task (--gpus-per-task 1, which
    Slurm binds to the task), that GPU is device 0 of those the task sees."""
    place = slurm_place(dict(os.environ), f"file://{Path(folder).resolve()}/rendezvous")
    if place is None:
        raise SystemExit("bsresearch.devices: not a task of a Slurm job step of several tasks "
                         "(SLURM_PROCID, SLURM_STEP_NUM_TASKS); it is started by the srun launcher")
    step = pickle.loads(Path(folder, STEP_FILE).read_bytes())
    for entry in reversed(step["sys_path"]):   # the callbacks' modules, importable as in the starting process
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        cfg, run_dir, progress, overwrite, callbacks = pickle.loads(step["payload"])
    except Exception as exc:   # e.g. a callback whose module this node cannot import: the run failed
        _write_report(folder, place.rank, {"state": "failed", "traceback": traceback.format_exc(),
                                           "error": f"the task could not read its run: {type(exc).__name__}: {exc}"})
        raise SystemExit(1) from None
    if torch.cuda.is_available() and torch.cuda.device_count() == 1:
        place = dataclasses.replace(place, local_rank=0)
    _rank_report(place, cfg, run_dir, folder, progress, overwrite, callbacks)


# ----------------------------------------------------------------------------- how the run ended
def _judge(cfg: RunConfig, rd: RunDir | None, reports: dict[int, dict[str, Any]], how_lost: str | None,
           device: torch.device) -> RunResult:
    """The run's result once its processes have ended (either launcher). A finished run directory stands.
    Otherwise the cause: a process's own failure or out-of-memory (one device's is the run's), else a process
    that was killed or lost (`died`; `how_lost` says how the launcher saw it), else what rank 0 recorded."""
    finished = finished_result(rd.path if rd else None)
    if finished is not None:
        return finished
    own = [(i, r) for i, r in sorted(reports.items()) if r.get("state") in ("oom", "failed")]
    if own:
        i, r = min(own, key=lambda item: item[1]["state"] != "oom")
        state, error, trace = r["state"], f"device {i}: {r.get('error')}", r.get("traceback")
    elif how_lost is not None or len(reports) < cfg.devices:
        state, trace = "died", None
        error = how_lost if how_lost is not None else "a device process ended without a report"
    elif rd is None and 0 in reports:
        r = reports[0]
        return RunResult(r["state"], r.get("metrics", {}), r.get("history", []), None, r.get("error"))
    else:
        state, error, trace = (reports.get(0) or {}).get("state", "died"), (reports.get(0) or {}).get("error"), None
    if rd:
        rd.write_status(state, error=error, traceback=trace, provenance=provenance(device))
    return RunResult(state, rd.metrics() if rd else {}, rd.history_rows() if rd and
                     (rd.path / "history.csv").exists() else [], rd.path if rd else None, error)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _lost_message(failure: BaseException) -> str:
    """'device process 1 (pid 123) was killed by SIGKILL' from torch.multiprocessing's exception."""
    index, pid = getattr(failure, "error_index", "?"), getattr(failure, "pid", "?")
    name = getattr(failure, "signal_name", None)
    code = getattr(failure, "exit_code", None)
    how = f"was killed by {name}" if name else f"exited with status {code}" if code is not None else \
        f"raised {str(failure).strip().splitlines()[-1] if str(failure).strip() else type(failure).__name__}"
    return f"device process {index} (pid {pid}) {how}; the other processes were stopped"
