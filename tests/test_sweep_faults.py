"""Faults that are the machinery's, not the runs': one worker killed from outside, a Dask worker lost, a disk
that fills up, a runs folder that turns read-only. Each run involved ends with a state that names what
happened (or the sweep's report does, where the disk refuses even that), the others carry on, finished runs
stay byte for byte, no file is left half-written, and a rerun finishes what is missing."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bsresearch.cli import main
from bsresearch.config import RunConfig
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, load_spec, run_sweep
from bsresearch.sweep.task import is_locked
from bsresearch.train import run

ROOT = Path(__file__).resolve().parent.parent


def spec_file(tmp_path: Path, name: str, points: int, steps: int = 400, width: int = 16, **base) -> Path:
    extra = "".join(f", {k}: {v}" for k, v in base.items())
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: {name}
        timeout: 300
        base: {{dataset: synthetic, train_size: 256, model: mlp, width: {width}, depth: 1, batch_size: 16,
               budget: steps, budget_amount: {steps}, eval_schedule: every, eval_every: 100, device: cpu{extra}}}
        grid: {{lr: {[round(0.01 * (i + 1), 3) for i in range(points)]}}}
    """))
    return path


def run_dirs(runs: Path, spec: Path) -> list[Path]:
    return [runs / load_spec(spec).name / p.run_id for p in expand(load_spec(spec))]


def finished_files(dirs: list[Path]) -> dict[str, dict[str, bytes]]:
    return {d.name: {f.name: f.read_bytes() for f in d.iterdir() if f.is_file() and f.name not in ("runner.log",)}
            for d in dirs if RunDir(d).is_finished()}


def no_half_written_files(dirs: list[Path]) -> bool:
    return not any(f.name.endswith(".tmp") for d in dirs if d.exists() for f in d.iterdir())


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
def test_a_worker_killed_from_outside_ends_died_and_a_rerun_finishes_it(tmp_path):
    spec, runs = spec_file(tmp_path, "kill1", 3, steps=3000), tmp_path / "runs"
    dirs = run_dirs(runs, spec)
    killed: list[Path] = []

    def kill_one() -> None:   # as the kernel's OOM killer would: SIGKILL to one worker process
        wait_for(lambda: any(is_locked(d) and (RunDir(d).status() or {}).get("runner") for d in dirs), 60, "a run")
        d = next(d for d in dirs if is_locked(d))
        time.sleep(0.5)
        os.kill(RunDir(d).status()["runner"]["pid"], signal.SIGKILL)
        killed.append(d)
    threading.Thread(target=kill_one, daemon=True).start()
    report = run_sweep(spec, runs, executor="local", engine="library", workers=2, fuse="off", progress=False)
    states = {o.run_id: o for o in report.outcomes}
    victim = states[killed[0].name]
    assert victim.state == "died" and "killed by SIGKILL" in victim.error
    assert sorted(o.state for o in report.outcomes) == ["died", "ok", "ok"]   # the others carried on
    kept = finished_files(dirs)
    again = run_sweep(spec, runs, executor="local", engine="library", workers=2, fuse="off", retry_failed=True,
                      progress=False)
    assert [o.run_id for o in again.outcomes] == [killed[0].name] and again.all_finished
    assert {k: v for k, v in finished_files(dirs).items() if k in kept} == kept and no_half_written_files(dirs)


@pytest.mark.slow
def test_a_lost_dask_worker_s_run_is_run_again(tmp_path):
    distributed = pytest.importorskip("distributed")
    spec, runs = spec_file(tmp_path, "lost", 2, steps=3000), tmp_path / "runs"
    dirs = run_dirs(runs, spec)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as lc, \
            distributed.Client(lc) as client:
        def lose_a_worker() -> None:
            wait_for(lambda: any(is_locked(d) for d in dirs), 60, "a run")
            time.sleep(0.5)
            pid = next(iter(client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)   # the nanny starts a new one; the scheduler reschedules its task
        threading.Thread(target=lose_a_worker, daemon=True).start()
        report = run_sweep(spec, runs, executor="dask", scheduler=lc.scheduler_address, engine="library",
                           fuse="off", progress=False)
    assert all(o.state in ("ok", "died") for o in report.outcomes), [(o.state, o.error) for o in report.outcomes]
    again = run_sweep(spec, runs, executor="local", engine="library", workers=2, fuse="off", retry_failed=True,
                      progress=False)
    assert again.all_finished and all(RunDir(d).state() == "ok" for d in dirs) and no_half_written_files(dirs)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 3 MiB (a real ENOSPC), mounted for the test; skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_fails_the_runs_it_stops_by_name_and_a_rerun_finishes(tmp_path, small_disk):
    # each checkpoint is ~0.85 MiB (mlp width 2560) beside a 1 MiB reserve: the third run cannot save its own
    spec, runs = spec_file(tmp_path, "full", 4, steps=20, width=2560), small_disk / "runs"
    dirs = run_dirs(runs, spec)
    report = run_sweep(spec, runs, executor="local", engine="library", workers=1, fuse="off", progress=False)
    outcomes = {o.run_id: o for o in report.outcomes}
    assert outcomes[dirs[0].name].state == "ok"
    failed = [o for o in report.outcomes if o.state != "ok"]
    assert failed and all("No space left on device" in (o.error or "") for o in failed), report.outcomes
    named = [d for d in dirs if (RunDir(d).status() or {}).get("state") == "failed"]
    assert named and "No space left on device" in RunDir(named[0]).status()["error"]   # written in the reserve
    assert no_half_written_files(dirs)
    kept = finished_files(dirs)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    again = run_sweep(spec, runs, executor="local", engine="library", workers=1, fuse="off", retry_failed=True,
                      progress=False)
    assert again.all_finished and all(RunDir(d).state() == "ok" for d in dirs)
    assert {k: v for k, v in finished_files(dirs).items() if k in kept} == kept and no_half_written_files(dirs)


def test_a_read_only_runs_folder_is_one_line_before_any_work(tmp_path, small_disk, capsys):
    runs = small_disk / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    spec = spec_file(tmp_path, "ro", 2)
    assert main(["sweep", str(spec), "--runs", str(runs), "--executor", "inline"]) == 2
    assert main(["train", "--runs", str(runs), "--dataset", "synthetic", "--budget-amount", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("read-only file system" in line and "choose another with --runs" in line
                                 for line in err), err


@pytest.fixture
def ext4_disk(tmp_path):
    """A 32 MiB ext4 file system on a loop device, mounted errors=remount-ro: writing trigger_fs_error turns it
    read-only under open files, as a failing disk does (remount,ro would refuse: EBUSY). Skipped where loop
    devices cannot be mounted."""
    image, mount = tmp_path / "disk.img", tmp_path / "ext4"
    mount.mkdir()
    subprocess.run(["truncate", "-s", "32M", str(image)], check=True)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    if made.returncode or subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(mount)],
                                         capture_output=True).returncode:
        pytest.skip("cannot make and mount an ext4 loop file system here (needs root and mkfs.ext4)")
    device = next(line.split()[0] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1] == str(mount))
    trigger = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
    if not trigger.exists():
        subprocess.run(["umount", str(mount)], capture_output=True)
        pytest.skip("this kernel has no ext4 trigger_fs_error")

    def repair() -> None:   # what an administrator does: unmount, fsck, mount again
        subprocess.run(["umount", str(mount)], check=True)
        subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True)
        subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(mount)], check=True)
    try:
        yield mount, lambda: trigger.write_text("1"), repair
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_runs_folder_that_turns_read_only_stops_its_runs_by_name_and_a_rerun_finishes(tmp_path, ext4_disk):
    mount, turn_read_only, repair = ext4_disk
    spec, runs = spec_file(tmp_path, "ro", 3, steps=3000), mount / "runs"
    dirs = run_dirs(runs, spec)

    def fail_the_disk() -> None:
        wait_for(lambda: RunDir(dirs[0]).is_finished() and any(is_locked(d) for d in dirs[1:]), 120, "a finished run")
        time.sleep(0.3)
        turn_read_only()
    threading.Thread(target=fail_the_disk, daemon=True).start()
    report = run_sweep(spec, runs, executor="local", engine="library", workers=1, fuse="off", progress=False)
    assert report.outcomes[0].state == "ok"
    bad = [o for o in report.outcomes if o.state != "ok"]
    assert len(bad) == 2 and all("Read-only file system" in (o.error or "") for o in bad), report.outcomes
    kept = finished_files(dirs)
    repair()
    again = run_sweep(spec, runs, executor="local", engine="library", workers=1, fuse="off", retry_failed=True,
                      progress=False)
    assert again.all_finished and all(RunDir(d).state() == "ok" for d in dirs)
    assert {k: v for k, v in finished_files(dirs).items() if k in kept} == kept and no_half_written_files(dirs)


def test_other_os_errors_at_the_end_of_a_run_are_not_taken_for_the_disk_s(tmp_path, monkeypatch):
    def refuse(self, metrics):
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    monkeypatch.setattr(RunDir, "write_metrics", refuse)
    cfg = RunConfig(dataset="synthetic", train_size=64, width=8, batch_size=16, budget="steps", budget_amount=4)
    with pytest.raises(OSError, match="Input/output error"):
        run(cfg, tmp_path / "run", progress=False)
