"""Dask executors: a LocalCluster (processes, one thread each), an existing scheduler by address, and the
Slurm/PBS job scripts dask-jobqueue would submit (checked without a cluster)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bsresearch.config import ConfigError
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, job_script, load_spec, run_sweep
from bsresearch.sweep.cli import parse_cluster_options

distributed = pytest.importorskip("distributed")
ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "smoke.yaml"


@pytest.fixture
def two_runs(tmp_path) -> Path:
    """The smoke spec cut to two runs (one per Dask worker)."""
    spec = yaml.safe_load(SMOKE.read_text())
    spec.update(name="two", grid={"batch_size": [16, 64]}, notebook=str(ROOT / "notebooks" / "01_train.ipynb"),
                analysis=None)
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as lc:
        yield lc


@pytest.mark.slow
def test_sweep_on_an_existing_scheduler_by_address(tmp_path, cluster, two_runs):
    report = run_sweep(two_runs, runs_root=tmp_path, executor="dask", scheduler=cluster.scheduler_address,
                       engine="library", progress=False)
    assert sorted(o.state for o in report.outcomes) == ["ok"] * 2 and report.all_finished
    pids = {RunDir(tmp_path / "two" / p.run_id).status()["runner"]["pid"] for p in expand(load_spec(two_runs))}
    assert len(pids) == 2  # each run in its own worker process
    again = run_sweep(two_runs, runs_root=tmp_path, executor="dask", scheduler=cluster.scheduler_address,
                      engine="library", progress=False)
    assert again.outcomes == ()


def test_localcluster_workers_know_their_slot(cluster):
    from bsresearch.sweep.supervise import current_slot
    with distributed.Client(cluster) as client:
        futures = [client.submit(current_slot, workers=[address], pure=False)
                   for address in client.scheduler_info()["workers"]]
        slots = client.gather(futures)
    assert sorted(slots) == [0, 1]  # each worker's slot (and so its GPU) comes from its name


def test_the_device_launcher_reaches_a_dask_worker_with_its_task(tmp_path, cluster, monkeypatch):
    """A Dask worker's environment does not hold the sweep's choice (--launcher): the task carries it, and the
    worker process it starts gets it (supervise.worker_env runs on the Dask worker)."""
    from bsresearch.devices.launcher import VARIABLE
    from bsresearch.sweep.supervise import worker_env
    from bsresearch.sweep.task import RunTask
    monkeypatch.delenv(VARIABLE, raising=False)
    task = RunTask(run_dir=str(tmp_path), config={"devices": 2}, label="x", engine="library", launcher="srun")
    with distributed.Client(cluster) as client:
        env, before = client.gather([client.submit(worker_env, task, None, pure=False),
                                     client.submit(os.getenv, VARIABLE, pure=False)])
    assert env[VARIABLE] == "srun" and before is None


@pytest.mark.slow
def test_dask_executor_starts_its_own_localcluster_and_runs_papermill(tmp_path, two_runs):
    report = run_sweep(two_runs, runs_root=tmp_path, executor="dask", workers=2, progress=False)
    assert sorted(o.state for o in report.outcomes) == ["ok"] * 2
    assert all((tmp_path / "two" / o.run_id / "run.ipynb").exists() for o in report.outcomes)


def test_slurm_and_pbs_job_scripts_without_a_cluster():
    slurm = job_script("slurm", parse_cluster_options(
        ["queue=gpu", "account=lab", "walltime=01:30:00", "memory=8GB",
         'job_extra_directives=["--gres=gpu:1"]']))
    assert slurm.startswith("#!/usr/bin/env bash")
    for line in ("#SBATCH -p gpu", "#SBATCH -A lab", "#SBATCH -t 01:30:00", "#SBATCH --gres=gpu:1",
                 "#SBATCH --cpus-per-task=1", "export OMP_NUM_THREADS=1"):
        assert line in slurm, line
    assert f"{sys.executable} -m distributed.cli.dask_worker" in slurm and "--nthreads 1" in slurm
    pbs = job_script("pbs", {"walltime": "00:20:00"})
    assert "#PBS -l walltime=00:20:00" in pbs and "ncpus=1" in pbs and "--nthreads 1" in pbs
    with pytest.raises(ConfigError, match="--cluster-option"):
        job_script("slurm", {"no_such_option": 1})
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_cluster_options(["queue"])


def test_job_script_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "bsresearch", "sweep", str(SMOKE), "--cluster", "slurm",
                           "--cluster-option", "queue=short", "--job-script"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH -p short" in proc.stdout
