"""kill -9 a running sweep (a real subprocess), rerun it: finished runs are kept byte for byte, interrupted
ones are redone, nothing is duplicated or left corrupted, and nothing keeps running after the kill."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml
from conftest import compared, wait_until

from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, is_locked, load_spec, run_sweep
from bsresearch.sweep.task import is_complete, pid_alive
from bsresearch.train import run

ROOT = Path(__file__).resolve().parent.parent


OWN_MODEL = """
import torch, torch.nn as nn
from torch.utils.data import TensorDataset

def make_model(hidden=16):
    return nn.Sequential(nn.Linear(20, hidden), nn.GELU(), nn.LayerNorm(hidden), nn.Linear(hidden, 4))

def make_data():
    x = torch.randn(320, 20, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, (x[:, :4] * torch.arange(1.0, 5.0)).argmax(1))
"""


def write_spec(tmp_path: Path, name: str, own_model: bool = False, **base_changes) -> Path:
    spec = yaml.safe_load((ROOT / "experiments" / "smoke.yaml").read_text())
    spec.update(name=name, notebook=str(ROOT / "notebooks" / "01_train.ipynb"), analysis=None)
    if own_model:  # the same sweep on a model and data of the user's, given as FILE.py:NAME
        (tmp_path / "own.py").write_text(OWN_MODEL)
        for key in ("width", "depth", "train_size"):
            spec["base"].pop(key)
        spec["base"].update(model=f"{tmp_path / 'own.py'}:make_model", dataset=f"{tmp_path / 'own.py'}:make_data",
                            model_kwargs={"hidden": 16})
    spec["base"].update(base_changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start_sweep(spec: Path, runs: Path, *options: str) -> subprocess.Popen:
    # PATH without the virtualenv: papermill's kernel must still be this environment's Python
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    return subprocess.Popen([sys.executable, "-m", "bsresearch", "sweep", str(spec), "--runs", str(runs), "--quiet",
                             *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def check_files(run_dir: Path) -> None:
    """Every file a run directory holds is whole: JSON parses, the CSV parses with consistent rows."""
    for name in ("config.json", "status.json", "metrics.json"):
        if (run_dir / name).exists():
            json.loads((run_dir / name).read_text())
    if (run_dir / "history.csv").exists():
        rows = list(csv.reader((run_dir / "history.csv").open()))
        assert all(len(r) == len(rows[0]) for r in rows)
    if (run_dir / "run.ipynb").exists():
        nbformat.read(run_dir / "run.ipynb", as_version=4)


TRAINING_FILES = ("config.json", "history.csv", "metrics.json", "checkpoint.pt")


def snapshot(sweep_dir: Path) -> dict[str, dict[str, bytes]]:
    """The files of every finished run, to check they are never touched again: all of them for a complete
    run; the training's results for a run killed while its notebook was still plotting (the notebook is
    executed again, the training is not)."""
    out = {}
    for d in sweep_dir.iterdir():
        if d.is_dir() and RunDir(d).is_finished():
            names = TRAINING_FILES if not is_complete(d) else [f.name for f in d.iterdir() if f.name != "runner.log"]
            out[d.name] = {n: (d / n).read_bytes() for n in names if (d / n).is_file()}
    return out


@pytest.mark.slow
# [own_model] is exhaustive: [built_in] runs the same kill and resume, test_own_model.py a user's model's sweep
@pytest.mark.parametrize("own_model", [False, pytest.param(True, marks=pytest.mark.exhaustive)],
                         ids=["built_in", "own_model"])
def test_kill_9_during_a_papermill_sweep_then_resume(tmp_path, own_model):
    spec = write_spec(tmp_path, "killme", own_model)
    sweep_dir = tmp_path / "runs" / "killme"
    points = expand(load_spec(spec))
    proc = start_sweep(spec, tmp_path / "runs", "--workers", "2", "--fuse", "off")  # fused groups: test_sweep_fused

    def some_done_some_running() -> bool:
        states = [RunDir(sweep_dir / p.run_id).state() for p in points]
        running = [p for p in points if is_locked(sweep_dir / p.run_id)]
        return "ok" in states and bool(running)

    try:
        wait_until(some_done_some_running, 120, "one finished run and one in progress")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # the workers die with the sweep, their kernels within a second or two
    wait_until(lambda: not any(is_locked(sweep_dir / p.run_id) for p in points), 10, "worker locks released")
    kernels = [((RunDir(sweep_dir / p.run_id).status() or {}).get("provenance") or {}).get("pid") for p in points
               if RunDir(sweep_dir / p.run_id).state() == "running"]
    wait_until(lambda: not any(pid_alive(pid) for pid in kernels if pid), 10, "kernels gone")
    for p in points:
        check_files(sweep_dir / p.run_id)
    kept = snapshot(sweep_dir)
    assert 1 <= len(kept) < len(points)
    complete = {p.run_id for p in points if is_complete(sweep_dir / p.run_id)}

    report = run_sweep(spec, runs_root=tmp_path / "runs", workers=2, progress=False, fuse="off")
    assert {o.run_id for o in report.outcomes} == {p.run_id for p in points} - complete
    assert report.all_finished and all(o.state == "ok" for o in report.outcomes)
    assert {d.name for d in sweep_dir.iterdir() if d.is_dir()} == {p.run_id for p in points}  # no duplicates
    after = snapshot(sweep_dir)
    for run_id, files in kept.items():  # finished runs untouched, byte for byte
        assert files == {name: after[run_id][name] for name in files}
    for p in points:
        d = sweep_dir / p.run_id
        check_files(d)
        assert not list(d.glob(".*.tmp")) and not (d / ".run.partial.ipynb").exists()
    redone = next(p for p in points if p.run_id not in kept)  # trained again from the start
    reference = run(redone.config, None, progress=False).metrics
    metrics = RunDir(sweep_dir / redone.run_id).metrics()
    assert compared(metrics) == compared(reference)


@pytest.mark.slow
def test_kill_9_at_many_moments_then_resume_from_checkpoints(tmp_path):
    """Inline sweeps killed again and again (mid-training after a checkpoint, and a little later each
    time): each rerun keeps what finished, resumes interrupted runs from their checkpoints, and the final
    results equal uninterrupted runs exactly."""
    spec = write_spec(tmp_path, "again", budget_amount=1000, eval_every=250, checkpoint_every=100,
                      save_checkpoint=False)
    sweep_dir = tmp_path / "runs" / "again"
    points = expand(load_spec(spec))

    def mid_training(since: float) -> bool:
        """A run is training and has written a checkpoint since `since`."""
        for p in points:
            ckpt = sweep_dir / p.run_id / "checkpoint.pt"
            if RunDir(ckpt.parent).state() == "running" and ckpt.exists() and ckpt.stat().st_mtime > since:
                return True
        return False

    kept: dict[str, dict[str, bytes]] = {}
    for attempt in range(3):  # killed mid-training, a little later each time
        started = time.time()
        proc = start_sweep(spec, tmp_path / "runs", "--executor", "inline")
        try:
            wait_until(lambda proc=proc, started=started: proc.poll() is not None or mid_training(started), 120,
                       "a run mid-training")
            time.sleep(0.25 * attempt)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        for p in points:
            if (sweep_dir / p.run_id).exists():
                check_files(sweep_dir / p.run_id)
        now_kept = snapshot(sweep_dir)
        assert all({n: now_kept[k][n] for n in v} == v for k, v in kept.items())
        kept = now_kept
    proc = start_sweep(spec, tmp_path / "runs", "--executor", "inline")
    assert proc.wait(timeout=120) == 0, proc.stdout.read().decode()
    assert {d.name for d in sweep_dir.iterdir() if d.is_dir()} == {p.run_id for p in points}
    resumed = 0
    for p in points:
        status = RunDir(sweep_dir / p.run_id).status()
        assert status["state"] == "ok"
        resumed += status.get("resumed_from") is not None
        metrics = RunDir(sweep_dir / p.run_id).metrics()
        reference = run(p.config, None, progress=False).metrics
        assert compared(metrics) == compared(reference), p.label
    assert resumed >= 1


@pytest.mark.slow
def test_kill_sigterm_stops_a_sweep_as_ctrl_c_does(tmp_path):
    # a sweep started with `&` by a script ignores SIGINT (the shell leaves it so), so `kill PID` (SIGTERM) is how
    # one stops it: it says "interrupted" (not a silent death), its workers stop with it, and the next run of the
    # sweep finishes what they held
    spec = write_spec(tmp_path, "termme")
    sweep_dir = tmp_path / "runs" / "termme"
    points = expand(load_spec(spec))
    proc = start_sweep(spec, tmp_path / "runs", "--workers", "2", "--fuse", "off")
    try:
        wait_until(lambda: any(is_locked(sweep_dir / p.run_id) for p in points), 120, "a run in progress")
    finally:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"bsresearch: interrupted" in out, out[-500:]
    wait_until(lambda: not any(is_locked(sweep_dir / p.run_id) for p in points), 10, "worker locks released")
    assert not all(RunDir(sweep_dir / p.run_id).is_finished() for p in points)
    report = run_sweep(spec, runs_root=tmp_path / "runs", workers=2, progress=False, fuse="off")
    assert report.all_finished and all(o.state == "ok" for o in report.outcomes)
