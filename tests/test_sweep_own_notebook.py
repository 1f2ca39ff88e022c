"""Sweeps of a training notebook of one's own (a spec's `notebook:` that is not the run template): the spec is
checked against the notebook's parameters cell, the values and `run_dir` are injected, and the runs it writes
(bsresearch.runwriter.RunWriter) resume, survive a killed worker, and report as the run template's do."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until
from own_notebook import PARAMETERS, TRAINING, write_notebook, write_project
from test_srun import FakeSrun

from bsresearch.cli import main
from bsresearch.config import ConfigError
from bsresearch.rundir import RunDir
from bsresearch.runwriter import RunWriter
from bsresearch.sweep import expand, is_locked, load_spec, run_sweep
from bsresearch.sweep.spec import own_run_id

ROOT = Path(__file__).resolve().parent.parent


def spec_error(tmp_path: Path, **changes) -> str:
    path = write_project(tmp_path / "proj", changes)
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    return str(info.value)


# ----------------------------------------------------------------------------- the spec against the notebook
def test_the_grid_is_checked_against_the_notebooks_parameters_cell(tmp_path):
    message = spec_error(tmp_path, grid={"batch_sise": [8, 32]})
    assert "grid.batch_sise: not a parameter of own.ipynb (did you mean 'batch_size'?)" in message
    assert "accepted (its parameters cell): batch_size, learning_rate, steps, gate" in message
    assert "\n" not in message
    assert "lr: not a parameter" in spec_error(tmp_path, base={"lr": 0.1})   # RunConfig's names are not its names
    assert "measurements: the run template's" in spec_error(tmp_path, measurements=["hessian"])
    assert "grid.seed: set by the sweep itself" in spec_error(tmp_path, grid={"seed": [0, 1]})
    assert "base.run_dir: set by the sweep itself" in spec_error(tmp_path, base={"run_dir": "x"})


def test_a_notebook_without_run_dir_is_refused_in_one_line(tmp_path):
    path = write_project(tmp_path / "proj")
    write_notebook(tmp_path / "proj" / "notebooks" / "own.ipynb", PARAMETERS.replace("run_dir = None", "out = None"))
    with pytest.raises(ConfigError, match="assigns no run_dir: a training notebook of your own declares"):
        load_spec(path)


def test_the_run_template_is_still_the_run_template():
    spec = load_spec(ROOT / "experiments" / "smoke.yaml")
    assert spec.own is None and all(p.config is not None for p in expand(spec))


def test_points_carry_the_injected_values_and_a_run_id_over_the_code(tmp_path):
    path = write_project(tmp_path / "proj", {"base": {"learning_rate": "1e-3"}})   # YAML 1.1 reads it as text
    spec = load_spec(path)
    points = expand(spec)
    assert [p.parameters for p in points] == [{"learning_rate": 1e-3, "batch_size": b, "seed": s}
                                              for b in (8, 32) for s in (0, 1)]
    assert all(p.config is None and p.task_config == p.parameters for p in points)
    assert len({p.run_id for p in points}) == 4
    assert points[0].run_id == own_run_id(spec.own, points[0].parameters)
    notebook = tmp_path / "proj" / "notebooks" / "own.ipynb"
    nb = json.loads(notebook.read_text())   # outputs saved by JupyterLab: the same runs
    nb["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hello\n"]}]
    notebook.write_text(json.dumps(nb))
    assert [p.run_id for p in expand(load_spec(path))] == [p.run_id for p in points]
    write_notebook(notebook, training=TRAINING.replace("steps + 1", "steps + 2"))   # edited code: new runs
    assert not {p.run_id for p in expand(load_spec(path))} & {p.run_id for p in points}


def test_the_library_engine_is_refused_for_a_notebook_of_ones_own(tmp_path):
    path = write_project(tmp_path / "proj")
    with pytest.raises(ConfigError, match="^the inline executor calls train.run in this process on a RunConfig; "
                                          "own.ipynb is a training notebook of your own, which runs through papermill"):
        run_sweep(path, executor="inline", dry_run=True)
    with pytest.raises(ConfigError, match="^--engine library calls train.run on a RunConfig; own.ipynb"):
        run_sweep(path, engine="library", dry_run=True)


def test_the_runs_and_the_dry_run_go_to_the_project_of_the_spec_from_any_folder(tmp_path, monkeypatch, capsys):
    path = write_project(tmp_path / "proj")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    report = run_sweep(Path("..") / "proj" / "experiments" / "own.yaml", dry_run=True, progress=False)
    assert report.sweep_dir == (tmp_path / "proj" / "runs" / "own").resolve()
    assert [p.action for p in report.planned] == ["run"] * 4 and report.fuse == "off"
    assert not (tmp_path / "elsewhere" / "runs").exists()
    assert load_spec(path).project == (tmp_path / "proj").resolve()
    assert main(["sweep", str(Path("..") / "proj" / "experiments" / "own.yaml"), "--check"]) == 1
    assert "sweep own: 4 runs: new 4; 4 of 4 runs not finished (4 pending)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the writer
def test_run_writer_writes_the_run_directory_format(tmp_path):
    with RunWriter(tmp_path / "r", {"batch_size": 8, "seed": 1}) as run:
        assert RunDir(tmp_path / "r").state() == "running"
        assert RunDir(tmp_path / "r").status()["provenance"]["pid"] == os.getpid()
        run.log(step=1, train_loss=2.0)
        run.log(step=2, train_loss=float("nan"), b_simple=3.5)   # a column that appears later
        run.finish(test_loss=1.5)
    rd = RunDir(tmp_path / "r")
    assert rd.state() == "ok" and rd.metrics() == {"test_loss": 1.5} and rd.damage() == []
    assert rd.config() == {"batch_size": 8, "seed": 1, "derived": {"writer": "bsresearch.runwriter.RunWriter"}}
    rows = rd.history_rows()
    assert len(rows) == 2 and rows[0]["train_loss"] == 2.0 and rows[1]["b_simple"] == 3.5
    with pytest.raises(ZeroDivisionError), RunWriter(tmp_path / "f", {}) as run:
        run.log(step=1)
        1 / 0  # noqa: B018 - the training fails
    status = RunDir(tmp_path / "f").status()
    assert status["state"] == "failed" and status["error"] == "ZeroDivisionError: division by zero"
    with pytest.raises(ValueError, match="RunWriter needs the run's folder: a sweep sets the notebook's run_dir"):
        RunWriter(None, {})   # a notebook run by hand without a folder
    with RunWriter(tmp_path / "g", {}):
        pass  # never finished: not a finished run
    assert RunDir(tmp_path / "g").status()["error"] == "the training block ended without RunWriter.finish"


# ----------------------------------------------------------------------------- a whole sweep, a worker killed
def worker_pid(run_dir: Path) -> int | None:
    return ((RunDir(run_dir).status() or {}).get("runner") or {}).get("pid")


@pytest.mark.slow
# [hf] is exhaustive: [loop] runs the same sweep, kill and resume; test_integrations_hf.py the callback's run_dir
@pytest.mark.parametrize("trainer", ["loop", pytest.param("hf", marks=pytest.mark.exhaustive)])
def test_a_sweep_of_ones_own_notebook_survives_a_killed_worker_resumes_and_reports(tmp_path, trainer):
    """2 batch sizes x 2 seeds on two workers, started from another folder; one run is held after its first
    step (its notebook waits for a file) and its worker is killed with SIGKILL: that run is recorded died, the
    others finish; the rerun redoes it alone, the finished ones untouched byte for byte; the report draws. The
    notebook is a plain loop writing with RunWriter, or a Hugging Face Trainer with bsresearch's callback given
    run_dir (a tiny Llama from a config, offline)."""
    if trainer == "hf":
        pytest.importorskip("transformers")
    large, steps = (8, 6) if trainer == "hf" else (32, 30)
    gate = tmp_path / "gate"
    spec_path = write_project(tmp_path / "proj", {"overrides": [{"where": {"batch_size": large, "seed": 1},
                                                                 "set": {"gate": str(gate)}}]}, trainer=trainer)
    (tmp_path / "elsewhere").mkdir()
    sweep_dir = tmp_path / "proj" / "runs" / "own"
    points = expand(load_spec(spec_path))
    held = next(p for p in points if p.parameters.get("gate"))
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "bsresearch", "sweep", "../proj/experiments/own.yaml", "--quiet"]
    proc = subprocess.Popen([*command, "--workers", "2"], cwd=tmp_path / "elsewhere", env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: len(RunDir(sweep_dir / held.run_id).history_rows()) >= 1
                   and is_locked(sweep_dir / held.run_id), 600, "the held run past its first step")
        os.kill(worker_pid(sweep_dir / held.run_id), signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out.decode()[-2000:]
    states = {p.run_id: RunDir(sweep_dir / p.run_id).state() for p in points}
    assert states.pop(held.run_id) == "died" and set(states.values()) == {"ok"}, out.decode()
    assert "killed by SIGKILL" in RunDir(sweep_dir / held.run_id).status()["error"]
    finished = {run_id: {f.name: f.read_bytes() for f in (sweep_dir / run_id).iterdir()
                         if f.is_file() and f.name != "runner.log"} for run_id in states}

    dry = subprocess.run([*command, "--dry-run", "--retry-failed"], cwd=tmp_path / "proj", env=env,
                         capture_output=True, text=True, check=True).stdout
    assert f"{held.run_id}  batch_size={large} seed=1  died" in dry and "4 runs in" in dry and "1 to run" in dry
    gate.touch()
    again = subprocess.run([*command, "--retry-failed", "--workers", "2"], cwd=tmp_path / "proj", env=env,
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "1 executed" in again.stdout and "ok 4" in again.stdout
    for run_id, files in finished.items():
        assert {n: (sweep_dir / run_id / n).read_bytes() for n in files} == files
    redone = RunDir(sweep_dir / held.run_id)
    assert redone.state() == "ok" and len(redone.history_rows()) == steps and redone.damage() == []
    assert redone.config()["batch_size"] == large and redone.config()["seed"] == 1

    report = subprocess.run([sys.executable, "-m", "bsresearch", "report", "../experiments/own.yaml", "--no-html"],
                            cwd=tmp_path / "proj" / "notebooks", env=env, capture_output=True, text=True)
    assert report.returncode == 0, report.stdout + report.stderr
    out_dir = tmp_path / "proj" / "reports" / "own"   # the project's, not notebooks/reports
    assert not (tmp_path / "proj" / "notebooks" / "reports").exists()
    assert {"metrics_vs_batch.png", "learning_curves.png", "summary.md"} <= {f.name for f in out_dir.iterdir()}
    summary = (out_dir / "summary.md").read_text()
    assert f"| {large} | 2 |" in summary
    if trainer == "loop":
        assert "| batch_size | n | test_loss_mean | train_loss_mean |" in summary
    else:   # the callback's B_simple, drawn against batch size
        assert "b_simple_ema_mean" in summary and (out_dir / "measurements_vs_batch.png").exists()


@pytest.mark.slow
def test_a_sweep_of_ones_own_notebook_on_dask(tmp_path):
    distributed = pytest.importorskip("distributed")
    spec_path = write_project(tmp_path / "proj", {"grid": {"batch_size": [8, 32]}, "seeds": 1})
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc:
        report = run_sweep(spec_path, executor="dask", scheduler=lc.scheduler_address, progress=False)
    assert sorted(o.state for o in report.outcomes) == ["ok", "ok"] and report.all_finished
    for p in expand(load_spec(spec_path)):
        rd = RunDir(tmp_path / "proj" / "runs" / "own" / p.run_id)
        assert rd.config()["batch_size"] == p.parameters["batch_size"] and len(rd.history_rows()) == 30
    assert [p.action for p in run_sweep(spec_path, dry_run=True, progress=False).planned] == ["skip", "skip"]


@pytest.mark.slow
def test_a_sweep_of_ones_own_notebook_inside_a_slurm_allocation(tmp_path, monkeypatch):
    """`--launcher srun` in a (stand-in) Slurm allocation of 2 tasks: 2 workers, each run of one's own notebook on
    one slot of the allocation, no job step (a step is for a run on several devices), the runs as elsewhere."""
    fake_srun = FakeSrun(tmp_path)   # tests/test_srun.py's stand-in srun, first on the PATH
    monkeypatch.setenv("PATH", f"{fake_srun.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(fake_srun.log))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    spec_path = write_project(tmp_path / "proj", {"seeds": 1})
    report = run_sweep(spec_path, launcher="srun", progress=False)
    assert report.workers == 2 and report.launcher == "srun"
    assert sorted(o.state for o in report.outcomes) == ["ok", "ok"] and fake_srun.calls() == []
    for p in expand(load_spec(spec_path)):
        rd = RunDir(tmp_path / "proj" / "runs" / "own" / p.run_id)
        assert rd.config()["batch_size"] == p.parameters["batch_size"] and len(rd.history_rows()) == 30
