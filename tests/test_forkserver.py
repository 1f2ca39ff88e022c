"""Workers forked from the fork server (bsresearch/sweep/forkserver.py) against workers started as fresh
processes: the same run gives the same numbers, a killed worker and a killed server end as "died", the
server stops forking once the package's source changes, and a sweep's kill still stops its workers
(test_sweep_kill.py runs whole sweeps through the server)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import compared, wait_until

from bsresearch.rundir import RunDir
from bsresearch.sweep import RunTask, forkserver, supervise
from bsresearch.sweep.task import pid_alive

pytestmark = pytest.mark.skipif(not forkserver.available(), reason="the fork server needs Linux's pidfd_open")


def task_for(tmp_path: Path, name: str, cfg) -> RunTask:
    (tmp_path / name).mkdir()  # as supervise._spawn makes it
    return RunTask(run_dir=str(tmp_path / name), config=cfg.to_dict(), label=name, engine="library", timeout=120)


def test_a_forked_worker_trains_the_run_a_fresh_process_trains(tmp_path, tiny, monkeypatch):
    cfg = tiny(budget_amount=40)
    forked = supervise.run_task(task_for(tmp_path, "forked", cfg))
    monkeypatch.setenv(forkserver.SWITCH, "0")
    fresh = supervise.run_task(task_for(tmp_path, "fresh", cfg))
    assert forked.state == fresh.state == "ok"
    a, b = RunDir(tmp_path / "forked"), RunDir(tmp_path / "fresh")
    assert compared(a.metrics()) == compared(b.metrics())
    # the forked worker ran in a process of its own, whose parent was the server, not this process
    provenance = a.status()["provenance"]
    assert provenance["pid"] not in (os.getpid(), b.status()["provenance"]["pid"])
    assert forkserver._client is not None and forkserver._client.alive
    assert "worker pid" in (tmp_path / "forked" / "runner.log").read_text()  # its log is the run's, as before


def test_which_way_a_worker_starts(tmp_path, tiny, monkeypatch):
    task = task_for(tmp_path, "which", tiny(budget_amount=5))
    proc = supervise._start(task, tmp_path, supervise.worker_env(task, None))
    assert isinstance(proc, forkserver.Forked) and proc.wait(60) == 0
    gpu_task = RunTask(**{**task.__dict__, "run_dir": str(tmp_path / "gpu"), "gpus": ("0",)})
    assert not forkserver.available(gpu_task.gpus)   # a sweep that hands out GPUs starts fresh processes
    monkeypatch.setenv(forkserver.SWITCH, "0")
    proc = supervise._start(task, tmp_path, supervise.worker_env(task, None))
    assert isinstance(proc, subprocess.Popen) and proc.wait(60) == 0


def test_a_killed_server_ends_its_workers_as_died_and_the_next_worker_gets_a_new_server(tmp_path, tiny):
    long = task_for(tmp_path, "long", tiny(budget_amount=10**6, eval_every=10**5))
    started = supervise._start(long, Path(long.run_dir), supervise.worker_env(long, None))
    assert isinstance(started, forkserver.Forked)
    wait_until(lambda: RunDir(long.run_dir).state() == "running", 60, "training to begin")
    server = forkserver._client
    assert server is not None
    server.proc.kill()
    assert started.wait(30) == -signal.SIGKILL          # Linux killed the worker with its parent
    wait_until(lambda: not pid_alive(started.pid), 10, "the worker to die with its server")
    after = supervise.run_task(task_for(tmp_path, "after", tiny(budget_amount=5)))
    assert after.state == "ok" and forkserver._client is not server


def test_a_killed_forked_worker_is_recorded_as_died(tmp_path, tiny):
    task = task_for(tmp_path, "killed", tiny(budget_amount=10**6, eval_every=10**5))
    started = supervise._start(task, Path(task.run_dir), supervise.worker_env(task, None))
    wait_until(lambda: RunDir(task.run_dir).state() == "running", 60, "training to begin")
    os.kill(started.pid, signal.SIGKILL)
    code = started.wait(30)
    assert code == -signal.SIGKILL
    assert supervise._judge(task, code, False, started.pid, task.timeout) is None
    status = RunDir(task.run_dir).status()
    assert status["state"] == "died" and "killed by SIGKILL" in status["error"]


def test_the_server_forks_no_worker_once_the_package_source_changed(tmp_path, tiny):
    # a copy of the package, served by its own server: edit a file of it and the server forks no more (a
    # worker would run the old code under the new commit's name); the worker it is running carries on, and the
    # server exits once that has ended
    copy = tmp_path / "src"
    shutil.copytree(Path(forkserver.__file__).resolve().parents[1], copy / "bsresearch",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    client = forkserver._Client(env)
    long = task_for(tmp_path, "long", tiny(budget_amount=10**6, eval_every=10**5))
    running = client.start(long.to_json(), Path(long.run_dir), env, Path(long.run_dir) / "runner.log")
    wait_until(lambda: RunDir(long.run_dir).state() == "running", 60, "training to begin")
    edited = copy / "bsresearch" / "losses.py"
    edited.write_text(edited.read_text() + "\n# edited\n")
    with pytest.raises(forkserver.Stale):
        client.start(task_for(tmp_path, "short", tiny(budget_amount=5)).to_json(), tmp_path, env, tmp_path / "x.log")
    assert not (tmp_path / "x.log").exists()
    assert running.poll() is None and pid_alive(running.pid) and client.alive   # not stopped by the change
    running.terminate()
    assert running.wait(30) == 128 + signal.SIGTERM   # the worker's own SIGTERM exit
    assert client.proc.wait(30) == 0
    wait_until(lambda: not client.alive, 10, "the client to see its server gone")


def test_a_forked_worker_reseeds_what_a_fresh_process_seeds_from_the_os():
    # forked children would otherwise share the server's `random` and numpy states (the kernels' start-up
    # back-off draws from `random`); _child calls _reseed first thing
    import random

    import numpy as np
    random.seed(0)
    np.random.seed(0)
    before = random.getstate(), np.random.get_state()[1].copy()
    forkserver._reseed()
    assert random.getstate() != before[0]
    assert not np.array_equal(np.random.get_state()[1], before[1])
