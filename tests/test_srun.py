"""The srun launcher (bsresearch/devices/launcher.py, devices.launch.run_on_devices): a run on several devices as
one Slurm job step, on the CPU with gloo, 2 tasks of 1 thread.

There is no Slurm here: a fake `srun` first on the PATH (FAKE_SRUN below) parses --ntasks N, starts N copies
of its command with the variables a job step's tasks get (SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS,
SLURM_NTASKS), waits for them, and, as --kill-on-bad-exit does, stops the others when one fails. It appends
its arguments to a log, one JSON list a line."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import KillAt, devices_spec, tiny_config

from bsresearch.cli import main as cli_main
from bsresearch.config import ConfigError
from bsresearch.devices.launch import srun_command
from bsresearch.devices.launcher import VARIABLE, check_launcher, device_launcher
from bsresearch.devices.place import GroupPlace, group_from_environment, slurm_place
from bsresearch.rundir import RunDir
from bsresearch.state import load_checkpoint
from bsresearch.sweep.task import RunTask
from bsresearch.train import run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

FAKE_SRUN = r'''#!{python}
"""A stand-in for Slurm's srun: one job step of --ntasks N tasks of the command, on this machine."""
import json, os, signal, subprocess, sys, time

args = sys.argv[1:]
with open(os.environ["FAKE_SRUN_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
valued = {{"--ntasks", "-n", "--gpus-per-task", "--cpus-per-task", "--job-name", "-J"}}
ntasks, i = 1, 0
while i < len(args) and args[i].startswith("-"):
    flag, eq, value = args[i].partition("=")
    if not eq and flag in valued:
        i += 1
        value = args[i]
    if flag in ("--ntasks", "-n"):
        ntasks = int(value)
    i += 1
command = args[i:]
tasks = []


def stop(grace=3.0):
    for task in tasks:
        if task.poll() is None:
            task.terminate()
    deadline = time.monotonic() + grace
    while any(task.poll() is None for task in tasks) and time.monotonic() < deadline:
        time.sleep(0.05)
    for task in tasks:
        if task.poll() is None:
            task.kill()
        task.wait()


signal.signal(signal.SIGTERM, lambda signum, frame: (stop(), sys.exit(128 + signum)))   # srun forwards it
tasks += [subprocess.Popen(command, env={{**os.environ, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
                                         "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_NTASKS": str(ntasks),
                                         "SLURM_STEP_ID": "0"}})
          for rank in range(ntasks)]
bad = 0
while any(task.poll() is None for task in tasks):
    codes = [task.poll() for task in tasks]
    bad = next((c for c in codes if c not in (None, 0)), 0)
    if bad:                     # --kill-on-bad-exit: one task failed, the step ends
        stop()
        break
    time.sleep(0.05)
bad = bad or next((task.returncode for task in tasks if task.returncode != 0), 0)
if bad:
    sys.exit(bad if bad > 0 else 128 - bad)
sys.exit(int(os.environ.get("FAKE_SRUN_EXIT", "0")))   # srun's own status, when every task succeeded
'''


class FakeSrun:
    def __init__(self, folder: Path):
        self.bin, self.log = folder / "bin", folder / "srun.log"
        self.bin.mkdir()
        script = self.bin / "srun"
        script.write_text(FAKE_SRUN.format(python=sys.executable))
        script.chmod(0o755)

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    """A fake srun first on the PATH, inside a (pretend) Slurm allocation; the launcher left to each test."""
    srun = FakeSrun(tmp_path)
    monkeypatch.setenv("PATH", f"{srun.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("FAKE_SRUN_LOG", str(srun.log))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv(VARIABLE, raising=False)
    for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return srun


def weights(run_dir):
    return load_checkpoint(Path(run_dir) / "checkpoint.pt")["state"]["model"]


def assert_same_run(a: Path, b: Path):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-5, atol=1e-6), k
    ha, hb = RunDir(a).history_rows(), RunDir(b).history_rows()
    assert [r["step"] for r in ha] == [r["step"] for r in hb]
    for ra, rb in zip(ha, hb):
        for key in ("train_loss", "test_loss", "test_acc", "lr", "examples"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-7), (ra["step"], key)
    assert RunDir(a).metrics()["test_loss"] == pytest.approx(RunDir(b).metrics()["test_loss"], rel=1e-5)


def step_folders(run_dir: Path) -> list[Path]:
    return list(Path(run_dir).glob(".devices-*"))


# ----------------------------------------------------------------------------- the same run, one step
def test_the_srun_launcher_trains_the_run_the_processes_launcher_trains(tmp_path, fake_srun, monkeypatch, capsys):
    """Oracle: the same 2-device run started by torch.multiprocessing. `bsresearch train --launcher srun` makes
    one srun call, a step of 2 tasks that meet through a file in the run directory (removed afterwards), and
    sets the launcher for its run only; srun's own exit status does not override the run its tasks finished,
    and a finished run starts no step and is not written again."""
    cfg = tiny_config(budget_amount=15, batch_size=64, save_checkpoint=True, devices=2)
    assert run(cfg, tmp_path / "processes").state == "ok"
    assert fake_srun.calls() == []                       # the default launcher is processes
    (tmp_path / "cfg.json").write_text(cfg.to_json())
    monkeypatch.setenv("FAKE_SRUN_EXIT", "3")            # every task ok, srun itself says otherwise
    assert cli_main(["train", str(tmp_path / "cfg.json"), "--launcher", "srun", "--run-dir", str(tmp_path / "srun"),
                     "--quiet"]) == 0
    assert "state: ok" in capsys.readouterr().out and VARIABLE not in os.environ
    assert_same_run(tmp_path / "processes", tmp_path / "srun")
    status = RunDir(tmp_path / "srun").status()
    assert status["state"] == "ok" and not status.get("error") and status["devices"]["count"] == 2
    [call] = fake_srun.calls()
    assert call[:2] == ["--ntasks", "2"] and "--exclusive" in call and "--kill-on-bad-exit=1" in call
    assert "--gpus-per-task" not in call                 # a CPU run asks for no GPU
    assert call[-4:-1] == [sys.executable, "-m", "bsresearch.devices"]
    assert Path(call[-1]).parent == (tmp_path / "srun").resolve() and not step_folders(tmp_path / "srun")
    before = (tmp_path / "srun" / "status.json").read_text()
    monkeypatch.setenv(VARIABLE, "srun")
    again = run(cfg, tmp_path / "srun")
    assert again.state == "ok" and len(fake_srun.calls()) == 1
    assert (tmp_path / "srun" / "status.json").read_text() == before


# ----------------------------------------------------------------------------- faults
def test_a_killed_task_ends_the_run_died_in_bounded_time(tmp_path, fake_srun, monkeypatch):
    """kill -9 of task 1 at step 10: the step ends (--kill-on-bad-exit), the run is `died` with srun's status and
    the task that left no report, the step's folder is removed. Task 0 outlives task 1 (it sees the group
    lost and records the run `died`): the resumable checkpoint of step 8 stays, and the run resumes from it on
    one device as the uninterrupted run goes."""
    monkeypatch.setenv(VARIABLE, "srun")
    cfg = tiny_config(budget_amount=16, batch_size=64, checkpoint_every=4, save_checkpoint=True, devices=2,
                      schedule="cosine")
    started = time.monotonic()
    result = run(cfg, tmp_path / "run", callbacks=[KillAt(10, rank=1)])
    assert time.monotonic() - started < 90
    assert result.state == "died", result.error
    assert result.error.startswith("the Slurm job step (srun) exited with status ")
    assert "device task(s) 1 ended without a report" in result.error or \
        "device task(s) 0, 1 ended without a report" in result.error
    assert RunDir(tmp_path / "run").state() == "died" and not step_folders(tmp_path / "run")
    checkpoint = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert checkpoint["state"]["step"] == 8 and checkpoint["resumable"]
    assert len(fake_srun.calls()) == 1
    resumed = run(cfg.replace(devices=1), tmp_path / "run")
    assert resumed.state == "ok" and RunDir(tmp_path / "run").status()["resumed_from"] == 8
    run(cfg.replace(devices=1), tmp_path / "whole")
    assert_same_run(tmp_path / "whole", tmp_path / "run")


STOPPED_WORKER = """
import os, subprocess, sys, time
from bsresearch.sweep.task import kill_children
pids = sys.argv[1]
task = ("import os, sys, time; open(os.path.join(sys.argv[1], os.environ['SLURM_PROCID']), 'w')"
        ".write(str(os.getpid())); time.sleep(120)")
srun = subprocess.Popen(["srun", "--ntasks", "2", sys.executable, "-c", task, pids])
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
deadline = time.monotonic() + 60
while len(os.listdir(pids)) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
kill_children()
print(srun.wait(timeout=30), other.wait(timeout=30))
"""


def test_a_stopped_worker_ends_its_runs_job_step(tmp_path, fake_srun):
    """A sweep worker that is stopped (its timeout, Ctrl-C) kills its children (task.kill_children), but gives
    srun SIGTERM, which srun forwards to the step's tasks: none is left running."""
    from bsresearch.sweep.task import pid_alive
    (tmp_path / "pids").mkdir()
    done = subprocess.run([sys.executable, "-c", STOPPED_WORKER, str(tmp_path / "pids")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(128 + signal.SIGTERM), str(-signal.SIGKILL)]   # srun: SIGTERM; others: KILL
    tasks = [int(p.read_text()) for p in (tmp_path / "pids").iterdir()]
    assert len(tasks) == 2 and not any(pid_alive(pid) for pid in tasks)


def test_a_task_that_cannot_read_its_run_reports_it_failed(tmp_path, monkeypatch):
    """A callback whose module a task cannot import (not on that node's filesystem): the task leaves a `failed`
    report naming it, rather than dying without one."""
    import pickle

    from bsresearch.devices.launch import STEP_FILE, step_task_main
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "vanishing.py").write_text("class Hook:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "mod"))
    import vanishing
    payload = pickle.dumps((tiny_config(devices=2), None, False, False, (vanishing.Hook(),)))
    monkeypatch.delitem(sys.modules, "vanishing")
    (tmp_path / "mod" / "vanishing.py").unlink()
    (tmp_path / STEP_FILE).write_bytes(pickle.dumps({"sys_path": [], "payload": payload}))
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    with pytest.raises(SystemExit) as exit_:
        step_task_main(tmp_path)
    report = json.loads((tmp_path / "rank1.json").read_text())
    assert exit_.value.code == 1 and report["state"] == "failed"
    assert report["error"].startswith("the task could not read its run: ModuleNotFoundError")


# ----------------------------------------------------------------------------- sweeps
SPEC = devices_spec("steps")


def test_a_sweep_with_launcher_srun_runs_each_run_as_one_step(tmp_path, fake_srun, monkeypatch, capsys):
    from bsresearch.sweep.runner import run_sweep
    (tmp_path / "steps.yaml").write_text(SPEC)
    monkeypatch.setenv("SLURM_NTASKS", "4")              # the allocation's tasks: 2 runs of 2 side by side
    dry = run_sweep(tmp_path / "steps.yaml", runs_root=tmp_path / "runs", dry_run=True, engine="library",
                    launcher="srun")
    assert dry.workers == 2 and "2 devices per run (one Slurm job step of 2 tasks per run)" in dry.summary()
    monkeypatch.delenv("SLURM_NTASKS")
    assert cli_main(["sweep", str(tmp_path / "steps.yaml"), "--runs", str(tmp_path / "runs"), "--launcher", "srun",
                     "--engine", "library", "--workers", "1", "--fuse", "off", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "ok 2" in out and "one Slurm job step of 2 tasks per run" in out
    calls = fake_srun.calls()
    assert len(calls) == 2 and all(c[:2] == ["--ntasks", "2"] for c in calls)
    run_dirs = {Path(c[-1]).parent for c in calls}      # each run its own step, meeting in its own folder
    assert len(run_dirs) == 2 and all(RunDir(d).state() == "ok" for d in run_dirs)


def test_the_launcher_travels_with_the_task(tmp_path, monkeypatch):
    from bsresearch.sweep import supervise
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    task = RunTask(run_dir=str(tmp_path), config={"devices": 2, "device": "auto"}, label="x", engine="library",
                   gpus=("0", "1", "2", "3"), launcher="srun")
    assert RunTask.from_json(task.to_json()) == task
    env = supervise.worker_env(task, 1)
    assert env[VARIABLE] == "srun" and "CUDA_VISIBLE_DEVICES" not in env   # Slurm binds the tasks' GPUs
    plain = supervise.worker_env(RunTask(run_dir=str(tmp_path), config={"devices": 2}, label="x",
                                         gpus=("0", "1", "2", "3")), 1)
    assert VARIABLE not in plain and plain["CUDA_VISIBLE_DEVICES"] == "2,3"


# ----------------------------------------------------------------------------- the choice and its errors
def test_the_step_and_its_tasks_places():
    slurm = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "7"}
    assert slurm_place(slurm, "file:///shared/run/.devices-x/rendezvous") == \
        GroupPlace(1, 2, 1, "file:///shared/run/.devices-x/rendezvous")
    assert group_from_environment(slurm, slurm=False) is None     # the srun launcher's own process starts a step
    assert group_from_environment({**slurm, "RANK": "0", "WORLD_SIZE": "2"}, slurm=False) == \
        GroupPlace(0, 2, 0, "env://")
    gpu = srun_command(4, True, "/shared/run/.devices-x", "abc123", threads=8)
    assert gpu[:5] == ["srun", "--ntasks", "4", "--gpus-per-task", "1"] and gpu[5:7] == ["--cpus-per-task", "8"]
    assert gpu[-3:] == ["-m", "bsresearch.devices", "/shared/run/.devices-x"]
    assert "--gpus-per-task" not in srun_command(2, False, "/f")
    assert device_launcher({}) == "processes" and device_launcher({VARIABLE: "srun"}) == "srun"
    assert check_launcher("processes", {}) == "processes"
    assert check_launcher("srun", {}, here=False) == "srun"        # remote Dask workers start the steps


def one_line_error(capsys, argv, *expected):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in err, err


def test_launcher_srun_outside_an_allocation_or_a_bad_launcher_is_one_line(tmp_path, fake_srun, monkeypatch,
                                                                             capsys):
    two = tiny_config(budget_amount=2, batch_size=64, devices=2)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(two.to_json())
    (tmp_path / "steps.yaml").write_text(SPEC)
    train = ["train", str(cfg), "--run-dir", str(tmp_path / "run"), "--quiet"]
    sweep = ["sweep", str(tmp_path / "steps.yaml"), "--runs", str(tmp_path / "runs"), "--engine", "library"]
    monkeypatch.delenv("SLURM_JOB_ID")
    one_line_error(capsys, [*train, "--launcher", "srun"], "no SLURM_JOB_ID", "salloc")
    one_line_error(capsys, [*sweep, "--launcher", "srun"], "no SLURM_JOB_ID")
    monkeypatch.setenv(VARIABLE, "srun")                           # the variable, not the option
    one_line_error(capsys, train, "no SLURM_JOB_ID")
    with pytest.raises(ConfigError, match="no SLURM_JOB_ID"):
        run(two, tmp_path / "run")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("PATH", str(tmp_path))                      # no srun there
    one_line_error(capsys, [*train, "--launcher", "srun"], "no `srun` command on the PATH")
    monkeypatch.setenv(VARIABLE, "mpi")
    one_line_error(capsys, train, f"{VARIABLE}='mpi' is not a device launcher; accepted: processes, srun")
    one_line_error(capsys, sweep, "accepted: processes, srun")
    with pytest.raises(ConfigError, match="accepted: processes, srun"):
        run(two, tmp_path / "run")
    monkeypatch.delenv(VARIABLE)
    with pytest.raises(SystemExit) as exit_:
        cli_main([*train, "--launcher", "mpi"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "invalid choice 'mpi'" in err and "accepted: processes, srun" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists() and fake_srun.calls() == []
