"""Sweeps end to end: the 2x2 smoke sweep through papermill, inline, resume, and the runner's own verdict
(ok, failed, timeout, died) on notebooks that misbehave the ways papermill misreports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from conftest import compared, crash_at_setup

from bsresearch.cli import main
from bsresearch.config import RunConfig
from bsresearch.rundir import RunDir
from bsresearch.sweep import RunTask, expand, load_spec, run_sweep, supervise
from bsresearch.sweep.executors import local_executor
from bsresearch.sweep.task import is_complete, pid_alive
from bsresearch.train import run

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "smoke.yaml"


def reference_metrics(cfg: RunConfig) -> dict:
    """The oracle: the same config trained in this process, without a run directory."""
    return run(cfg, None, progress=False).metrics


@pytest.mark.slow
def test_smoke_sweep_through_papermill_then_rerun_skips_everything(tmp_path, capsys):
    assert main(["sweep", str(SMOKE), "--workers", "2", "--runs", str(tmp_path), "--quiet", "--fuse", "off"]) == 0
    out = capsys.readouterr().out
    assert "ok 4" in out, out
    points = expand(load_spec(SMOKE))
    for p in points:
        rd = RunDir(tmp_path / "smoke" / p.run_id)
        status = rd.status()
        assert status["state"] == "ok" and status["runner"]["engine"] == "papermill"
        assert status["notebook_error"] is None
        nb = nbformat.read(rd.notebook_path, as_version=4)   # the executed notebook, complete
        assert "injected-parameters" in nb.cells[2].metadata.get("tags", [])
        assert all(c.metadata.papermill.status == "completed" for c in nb.cells if c.cell_type == "code")
        assert not list(rd.path.glob(".*.tmp")) and not (rd.path / ".run.partial.ipynb").exists()
        assert "without encryption" not in (rd.path / "runner.log").read_text()  # the kernel's TCP warning
    # papermill gives exactly what the library gives for the same config
    metrics = RunDir(tmp_path / "smoke" / points[3].run_id).metrics()
    assert compared(metrics) == compared(reference_metrics(points[3].config))
    manifest = json.loads((tmp_path / "smoke" / "sweep.json").read_text())
    assert [q["run_id"] for q in manifest["points"]] == [p.run_id for p in points]

    ended = {p.run_id: RunDir(tmp_path / "smoke" / p.run_id).status()["ended"] for p in points}
    report = run_sweep(SMOKE, runs_root=tmp_path, workers=2, progress=False)  # --fuse auto: nothing to do either
    assert report.outcomes == () and report.all_finished
    assert ended == {p.run_id: RunDir(tmp_path / "smoke" / p.run_id).status()["ended"] for p in points}


def test_inline_sweep_calls_the_library_and_a_failing_run_does_not_stop_it(tmp_path, monkeypatch):
    with monkeypatch.context() as crashing:
        crash_at_setup(crashing, batch_size=16, lr=0.2)
        report = run_sweep(SMOKE, runs_root=tmp_path, executor="inline", progress=False, fuse="off")
        again = run_sweep(SMOKE, runs_root=tmp_path, executor="inline", progress=False, fuse="off")
    states = {o.label: o.state for o in report.outcomes}
    assert states == {"batch_size=16 lr=0.05 seed=0": "ok", "batch_size=16 lr=0.2 seed=0": "failed",
                      "batch_size=64 lr=0.05 seed=0": "ok", "batch_size=64 lr=0.2 seed=0": "ok"}
    failed = next(o for o in report.outcomes if o.state == "failed")
    assert "simulated crash at setup" in failed.error and not report.all_finished
    point = next(p for p in expand(load_spec(SMOKE)) if p.label == "batch_size=64 lr=0.2 seed=0")
    metrics = RunDir(tmp_path / "smoke" / point.run_id).metrics()
    assert compared(metrics) == compared(reference_metrics(point.config))

    assert again.outcomes == ()  # failed runs are kept ...
    retried = run_sweep(SMOKE, runs_root=tmp_path, executor="inline", progress=False, retry_failed=True, fuse="off")
    assert [(o.label, o.state) for o in retried.outcomes] == [("batch_size=16 lr=0.2 seed=0", "ok")]  # ... until asked
    assert RunDir(failed_dir := tmp_path / "smoke" / failed.run_id).status()["runner"]["attempt"] == 2, failed_dir


def test_a_sweep_without_a_terminal_prints_a_line_per_finished_run(tmp_path, capsys):
    # pytest's stderr is not a terminal, as a log or a pipe is not: no bar, a line per run as it finishes
    report = run_sweep(SMOKE, runs_root=tmp_path, executor="inline", fuse="off")
    err = capsys.readouterr().err.splitlines()
    lines = [line for line in err if line.startswith("[")]
    assert len(lines) == len(report.outcomes) == 4
    for i, (line, o) in enumerate(zip(lines, report.outcomes), 1):
        assert line.startswith(f"[{i}/4] ok {o.label} ({o.run_id}): ") and " s into the sweep" in line
    run_sweep(SMOKE, runs_root=tmp_path / "quiet", executor="inline", fuse="off", progress=False)   # --quiet
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]


# ----------------------------------------------------------------------------- the runner's own verdict
def fake_notebook(path: Path, *cells: str) -> Path:
    """A run template stand-in: a parameters cell, then `cells` (run_dir and every field are injected)."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("run_dir = None")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


TRAIN = ("from bsresearch.config import RunConfig, FIELD_NAMES\nfrom bsresearch.train import run\n"
         "cfg = RunConfig(**{k: globals()[k] for k in FIELD_NAMES})\nrun(cfg, run_dir)")
PID = "import os, pathlib\npathlib.Path(run_dir, 'kernel.pid').write_text(str(os.getpid()))"
CASES = {  # name: (cells, expected state, text in error or notebook_error)
    "exit0_before_run": (["import sys\nsys.exit(0)", TRAIN], "failed", "sys.exit"),
    "raises_before_run": (["raise ValueError('bad cell')", TRAIN], "failed", "ValueError: bad cell"),
    "error_after_run": ([TRAIN, "raise KeyError('plot')"], "ok", "KeyError"),
    "kernel_dies": ([PID, "import os\nos._exit(3)"], "died", "kernel died"),
    "worker_killed": ([PID, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(30)"],
                      "died", "killed by SIGKILL"),
    "timeout": ([PID, "import time\ntime.sleep(60)"], "timeout", "timeout"),
    "timeout_after_run": ([TRAIN, PID, "import time\ntime.sleep(60)"], "ok", "the next sweep executes it again"),
}
TIMEOUTS = {"timeout": 6.0, "timeout_after_run": 20.0}  # seconds; the others get 120


@pytest.mark.slow
def test_runner_states_where_papermill_misreports(tmp_path, tiny, monkeypatch):
    monkeypatch.setattr(supervise, "STARTUP_GRACE", 0.0)  # the timeout case ends at its 6 s deadline
    cfg = tiny(budget_amount=5).to_dict()
    tasks = [RunTask(run_dir=str(tmp_path / name), config=cfg, label=name,
                     notebook=str(fake_notebook(tmp_path / f"{name}.ipynb", *cells)),
                     timeout=TIMEOUTS.get(name, 120.0))
             for name, (cells, _, _) in CASES.items()]
    with local_executor(2) as pool:
        outcomes = {o.label: o for o in pool.map(supervise.run_task, tasks)}
    for name, (_, state, text) in CASES.items():
        o = outcomes[name]
        assert o.state == state, (name, o)
        assert text in ((o.error or "") + (o.notebook_error or "")), (name, o)
        assert RunDir(tmp_path / name).state() == state
        assert (tmp_path / name / "run.ipynb").exists() or name == "worker_killed"
        kernel_pid = tmp_path / name / "kernel.pid"
        if kernel_pid.exists():  # a kernel never outlives its run
            pid = int(kernel_pid.read_text())
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not pid_alive(pid), name
    assert outcomes["error_after_run"].error is None
    # trained, then killed while plotting: finished, but its notebook is executed again by the next sweep
    assert not is_complete(tmp_path / "timeout_after_run") and is_complete(tmp_path / "error_after_run")


def test_worker_env_pins_threads_and_one_gpu_per_slot(tiny):
    task = RunTask(run_dir="/tmp/x", config=tiny(threads=1, device="auto").to_dict(), label="x",
                   gpus=("0", "1", "2"))
    env = supervise.worker_env(task, slot=4)
    assert env["OMP_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["BSRESEARCH_SUPERVISOR_PID"] == str(os.getpid())
    pinned = RunTask(run_dir="/tmp/x", config=tiny(device="cpu").to_dict(), label="x", gpus=("0", "1"))
    assert supervise.worker_env(pinned, slot=1).get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    together = threading.Barrier(3)   # each task waits for the other two: three threads of the pool at once

    def slot(_: int) -> int:
        together.wait(timeout=60)
        return supervise.current_slot()
    with local_executor(3) as pool:
        slots = sorted(pool.map(slot, range(3)))
    assert slots == [0, 1, 2]


def test_a_leftover_process_is_recognised_and_a_reused_pid_is_not(tmp_path):
    import socket
    import subprocess
    import sys

    from bsresearch.rundir import atomic_write_json
    from bsresearch.sweep.task import recorded_pid
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        def status(updated: str) -> None:
            atomic_write_json(tmp_path / "status.json", {"state": "running", "updated": updated,
                                                         "provenance": {"pid": proc.pid, "host": socket.gethostname()}})
        status(time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() + 5)))
        assert recorded_pid(tmp_path) == proc.pid          # alive, started before it wrote the status
        status(time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - 3600)))
        assert recorded_pid(tmp_path) is None               # that pid now belongs to a newer process
    finally:
        proc.kill()
        proc.wait()
    assert recorded_pid(tmp_path) is None                   # gone


@pytest.mark.slow
def test_the_kernel_is_this_environments_python_even_without_it_on_path(tmp_path, tiny, monkeypatch):
    import sys
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    nb = fake_notebook(tmp_path / "which.ipynb",
                       "import sys, pathlib\npathlib.Path(run_dir, 'python.txt').write_text(sys.executable)")
    task = RunTask(run_dir=str(tmp_path / "run"), config=tiny().to_dict(), label="which", notebook=str(nb))
    supervise.run_task(task)
    assert (tmp_path / "run" / "python.txt").read_text() == sys.executable


def test_a_worker_process_loads_neither_scipy_nor_pandas():
    # what a worker's modules import at load is paid once per run by a worker started as a fresh process (a
    # GPU sweep's), and once per sweep by the fork server, which imports the same (docs/runs.md#overhead);
    # scipy and pandas (~1.6 s) belong to analysis, imported where it uses them
    code = ("import importlib, sys\nfrom bsresearch.sweep.forkserver import PRELOAD\n"
            "for name in PRELOAD:\n    importlib.import_module(name)\n"
            "loaded = [m for m in ('scipy', 'pandas') if m in sys.modules]\n"
            "assert not loaded, f'a worker process loaded {loaded}'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
