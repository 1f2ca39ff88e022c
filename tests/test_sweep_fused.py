"""Fused groups in sweeps, with a stand-in fused trainer (tests/fused_stand_in: train.run per member, the
numbers the real one must give), so grouping, tasks, workers, executors, kill -9, resume and
--retry-failed are tested on their own: which runs group and why the others do not, a group through
the inline and the local executor (papermill and the group template), --fuse off as before, and a killed
group keeping its finished members byte for byte. (Out of memory in a group: tests/test_fused.py.)"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import compared

from bsresearch import results
from bsresearch.cli import main
from bsresearch.config import ConfigError
from bsresearch.fused import grouping
from bsresearch.fused.grouping import group_configs, group_id
from bsresearch.rundir import RunDir
from bsresearch.sweep import expand, is_locked, load_spec, run_sweep
from bsresearch.sweep.task import is_complete, wait_for_exit
from bsresearch.train import run

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "experiments" / "smoke.yaml"
STAND_IN_DIR = Path(__file__).resolve().parent / "fused_stand_in"
_spec = importlib.util.spec_from_file_location("fused_stand_in", STAND_IN_DIR / "sitecustomize.py")
stand_in = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stand_in)


@pytest.fixture
def fused(monkeypatch, tmp_path):
    """The stand-in fused trainer here and in every process a sweep starts; returns its call log."""
    import bsresearch.fused as package
    log = tmp_path / "train_group.log"
    log.touch()
    monkeypatch.setenv("BSRESEARCH_FUSED_STAND_IN", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STAND_IN_DIR), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(package, "train_group", stand_in.train_group, raising=False)
    monkeypatch.setattr(grouping, "default_blocker", lambda: stand_in.fusion_blocker)
    return log


def calls(log: Path) -> list[tuple[str, int]]:
    return [(g, int(n)) for g, n in (line.split() for line in log.read_text().splitlines())]


def write_spec(tmp_path: Path, name: str, grid: dict, seeds=(0,), **base_changes) -> Path:
    spec = yaml.safe_load(SMOKE.read_text())
    spec.update(name=name, notebook=str(ROOT / "notebooks" / "01_train.ipynb"), analysis=None, grid=grid,
                seeds=list(seeds))
    spec["base"].update(base_changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def metrics_of(sweep_dir: Path, run_id: str) -> dict:
    return compared(RunDir(sweep_dir / run_id).metrics())


def metrics_alone(cfg) -> dict:
    """The oracle: the same config trained once in this process, without a run directory."""
    return compared(run(cfg, None, progress=False).metrics)


# ----------------------------------------------------------------------------- grouping
def test_grouping_fuses_what_the_blocker_allows_and_says_why_not(tiny):
    cfgs = [tiny(batch_size=16, seed=0), tiny(batch_size=64, seed=0), tiny(batch_size=16, seed=1, lr=0.3),
            tiny(batch_size=16, seed=2), tiny(batch_size=8, seed=0), tiny(batch_size=64, seed=1)]
    g = group_configs(cfgs, fuse_max=32, blocker=stand_in.fusion_blocker)
    assert g.groups == ((0, 2, 3), (1, 5))
    assert g.alone == {4: "differs in batch_size"}
    # at most fuse_max per group, cut into near-equal groups in the sweep's order
    assert group_configs(cfgs[:1] + cfgs[2:4] + [tiny(batch_size=16, seed=s) for s in range(3, 8)], fuse_max=3,
                         blocker=stand_in.fusion_blocker).groups == ((0, 1, 2), (3, 4, 5), (6, 7))
    # more groups while workers would be idle; a run split off alone says so
    assert group_configs(cfgs, fuse_max=32, workers=3, blocker=stand_in.fusion_blocker).groups == ((0, 2, 3), (1, 5))
    four = group_configs(cfgs, fuse_max=32, workers=4, blocker=stand_in.fusion_blocker)
    assert four.groups == ((0, 2), (1, 5)) and four.alone[3] == "split off so that every worker has a run"
    # a config the fused trainer cannot take at all, and runs excluded by the runner
    picky = group_configs(cfgs, 32, blocker=lambda a, b: "uses noise_scale_every" if b.seed == 1 else
                          stand_in.fusion_blocker(a, b), excluded={0: "trained already"})
    assert picky.groups == ()
    assert picky.alone == {0: "trained already", 1: "differs in batch_size", 2: "uses noise_scale_every",
                           3: "differs in batch_size", 4: "differs in batch_size", 5: "uses noise_scale_every"}
    # a single run, and fuse_max 1: nothing fused
    lone = group_configs(cfgs[:1], 32, blocker=stand_in.fusion_blocker)
    assert lone.alone == {0: "no other pending run of the sweep"}
    assert group_configs(cfgs, 1, blocker=stand_in.fusion_blocker).groups == ()
    assert group_id(["b", "a"]) == group_id(["a", "b"]) != group_id(["a", "c"])


def test_on_a_cpu_a_run_joins_a_group_up_to_the_batch_where_fusing_was_measured_to_pay(tiny):
    """The bound depends on the model and its normalisation (grouping.CPU_FUSE_MAX_BATCH); a model not
    measured, a user's included, keeps 64."""
    cases = [(dict(model="cnn1d"), 512), (dict(model="cnn1d", batchnorm=True, ghost_batch_size=32), 512),
             (dict(model="cnn1d", batchnorm=True), 256), (dict(model="mlp"), 256),
             (dict(model="mlp", batchnorm=True), 64), (dict(model="convnet", dataset="fashion_mnist"), 64),
             (dict(model="my.py:net", width=None, depth=None), 64)]
    for fields, bound in cases:
        assert grouping.cpu_batch_too_large(tiny(batch_size=bound, **fields)) is None, fields
        assert grouping.cpu_batch_too_large(tiny(batch_size=bound + 2, **fields)) == (   # + 2: ghost BN's remainder
            f"batch_size {bound + 2} > {bound}: on a CPU fusing pays only for small batches "
            f"(grouping.CPU_FUSE_MAX_BATCH)"), fields


def test_without_the_fused_trainer_nothing_is_fused_and_the_plan_says_so(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "bsresearch.fused.compat", None)  # import fails
    g = group_configs([tiny(seed=0), tiny(seed=1)], 32)
    assert g.groups == () and set(g.alone.values()) == {grouping.NO_FUSED_TRAINER}


def test_the_fused_trainers_blocker_in_a_sweep_plan(tmp_path):
    """With bsresearch.fused.compat (no stand-in): seeds and learning rates fuse, batch sizes do not, and a
    feature fused training lacks (checkpoint_every) keeps a run alone with the trainer's reason."""
    import bsresearch.fused.compat  # noqa: F401 - the real blocker (a broken import fails, it does not skip)
    spec = write_spec(tmp_path, "real", {"batch_size": [16, 64], "lr": [0.05, 0.2]}, seeds=(0, 1))
    report = run_sweep(spec, runs_root=tmp_path, dry_run=True, workers=1)
    assert sorted(len(m) for m in report.groups.values()) == [4, 4]
    for members in report.groups.values():
        assert len({p.point.config.batch_size for p in report.planned if p.point.run_id in members}) == 1
    alone = run_sweep(write_spec(tmp_path, "ckpt", {"lr": [0.05, 0.2]}, checkpoint_every=10), runs_root=tmp_path,
                      dry_run=True)
    assert alone.groups == {} and all("checkpoint_every" in p.fusion for p in alone.planned)


# ----------------------------------------------------------------------------- sweeps
def test_inline_fused_sweep_gives_the_numbers_of_separate_runs(tmp_path, fused, capsys):
    fused_report = run_sweep(SMOKE, runs_root=tmp_path / "auto", executor="inline", progress=False)
    off = run_sweep(SMOKE, runs_root=tmp_path / "off", executor="inline", progress=False, fuse="off")
    assert fused_report.all_finished and off.all_finished
    # smoke: batch size [16, 64] x lr [0.05, 0.2]: lr does not change shapes, batch size does
    assert sorted(len(m) for m in fused_report.groups.values()) == [2, 2] and off.groups == {}
    assert sorted(n for _, n in calls(fused)) == [2, 2]
    for p in fused_report.planned:
        assert metrics_of(tmp_path / "auto" / "smoke", p.point.run_id) == metrics_of(tmp_path / "off" / "smoke",
                                                                                    p.point.run_id)
        status = RunDir(tmp_path / "auto" / "smoke" / p.point.run_id).status()
        assert status["group"] == p.group and status["runner"]["engine"] == "library"
        assert "group" not in RunDir(tmp_path / "off" / "smoke" / p.point.run_id).status()
    assert not (tmp_path / "off" / "smoke" / "groups").exists()
    groups = results.load("smoke", tmp_path / "auto").set_index("run_id")["fused_group"]   # the table shows it too
    assert groups.to_dict() == {p.point.run_id: p.group for p in fused_report.planned}
    assert results.load("smoke", tmp_path / "off")["fused_group"].isna().all()
    assert "group" in fused_report.plan_table() and "group" not in off.plan_table()
    assert "2 fused group(s)" in fused_report.summary()
    again = run_sweep(SMOKE, runs_root=tmp_path / "auto", executor="inline", progress=False)
    assert again.outcomes == () and len(calls(fused)) == 2  # resume: nothing left to do


def test_a_crash_fails_the_unfinished_members_and_retry_failed_redoes_only_them(tmp_path, fused, monkeypatch):
    import bsresearch.train as train
    real_run = train.run

    def flaky_run(cfg, run_dir, **kw):
        if cfg.batch_size == 16 and cfg.lr == 0.2:
            raise RuntimeError("simulated crash at setup")
        return real_run(cfg, run_dir, **kw)

    monkeypatch.setattr(train, "run", flaky_run)
    report = run_sweep(SMOKE, runs_root=tmp_path, executor="inline", progress=False)
    states = {o.label: o.state for o in report.outcomes}
    # the stand-in raises out of train_group: its group's unfinished members fail with the error
    assert states["batch_size=64 lr=0.05 seed=0"] == "ok" and states["batch_size=64 lr=0.2 seed=0"] == "ok"
    assert states["batch_size=16 lr=0.2 seed=0"] == "failed"
    failed = {o.run_id for o in report.outcomes if o.state == "failed"}
    assert all("simulated crash" in o.error for o in report.outcomes if o.state == "failed")
    kept = {o.run_id: (tmp_path / "smoke" / o.run_id / "metrics.json").read_bytes()
            for o in report.outcomes if o.state == "ok"}
    assert run_sweep(SMOKE, runs_root=tmp_path, executor="inline", progress=False).outcomes == ()
    monkeypatch.setattr(train, "run", real_run)
    retried = run_sweep(SMOKE, runs_root=tmp_path, executor="inline", progress=False, retry_failed=True)
    assert {o.run_id for o in retried.outcomes} == failed and retried.all_finished
    assert kept == {r: (tmp_path / "smoke" / r / "metrics.json").read_bytes() for r in kept}
    for r in failed:
        assert RunDir(tmp_path / "smoke" / r).status()["runner"]["attempt"] == 2


def test_dry_run_shows_groups_and_why_runs_stay_alone(tmp_path, fused, capsys):
    spec = write_spec(tmp_path, "plan", {"batch_size": [16, 64], "lr": [0.05, 0.2]}, seeds=(0, 1))
    spec_dict = yaml.safe_load(spec.read_text())
    spec_dict["variants"] = {"wide": {"width": 32}}
    spec.write_text(yaml.safe_dump(spec_dict))
    assert main(["sweep", str(spec), "--dry-run", "--runs", str(tmp_path), "--fuse-max", "3", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "group" in out and "why not fused" in out and "fused group(s)" in out
    report = run_sweep(spec, runs_root=tmp_path, dry_run=True, fuse_max=3, workers=1)
    assert all(len(m) <= 3 for m in report.groups.values()) and not (tmp_path / "plan").exists()
    with pytest.raises(ConfigError, match="fuse_max must be a positive integer"):
        run_sweep(spec, runs_root=tmp_path, dry_run=True, fuse_max=0)
    with pytest.raises(ConfigError, match="fuse must be one of auto, off"):
        run_sweep(spec, runs_root=tmp_path, dry_run=True, fuse="yes")
    # a spec with a run template of its own (an edited copy of 01_train): its runs are not fused (the group
    # template would skip its cells)
    own = write_spec(tmp_path, "own", {"lr": [0.05, 0.2]})
    d = yaml.safe_load(own.read_text())
    d["notebook"] = str(tmp_path / "my_train.ipynb")
    (tmp_path / "my_train.ipynb").write_bytes((ROOT / "notebooks" / "01_train.ipynb").read_bytes())
    own.write_text(yaml.safe_dump(d))
    report = run_sweep(own, runs_root=tmp_path, dry_run=True)
    assert report.groups == {} and all("not the run template" in p.fusion for p in report.planned)


@pytest.mark.slow
def test_fused_group_through_papermill_on_local_workers(tmp_path, fused):
    spec = write_spec(tmp_path, "pm", {"lr": [0.05, 0.1, 0.2]}, seeds=(0, 1))
    report = run_sweep(spec, runs_root=tmp_path, executor="local", workers=2, progress=False)
    assert report.all_finished, report.summary()
    assert sorted(len(m) for m in report.groups.values()) == [3, 3]  # 2 workers: 2 groups
    assert sorted(n for _, n in calls(fused)) == [3, 3]  # trained in the workers' kernels by train_group
    for gid in report.groups:
        notebook = json.loads((tmp_path / "pm" / "groups" / gid / "group.ipynb").read_text())
        assert all(c["metadata"]["papermill"]["status"] == "completed" for c in notebook["cells"]
                   if c["cell_type"] == "code")
        assert (tmp_path / "pm" / "groups" / gid / "runner.log").exists()
    for p in expand(load_spec(spec)):
        status = RunDir(tmp_path / "pm" / p.run_id).status()
        assert status["state"] == "ok" and status["runner"]["engine"] == "papermill" and status["group"]
        assert metrics_of(tmp_path / "pm", p.run_id) == metrics_alone(p.config)


@pytest.mark.slow
def test_kill_9_during_a_fused_group_keeps_finished_members_and_redoes_the_rest(tmp_path, fused):
    # one group of three seeds trained one after another by the stand-in trainer, each long enough (6000
    # steps) that the group's kernel cannot finish the rest in the second or two it outlives its worker
    spec = write_spec(tmp_path, "killg", {"lr": [0.05]}, seeds=(0, 1, 2), budget_amount=6000, eval_every=1000)
    sweep_dir = tmp_path / "runs" / "killg"
    points = expand(load_spec(spec))
    proc = subprocess.Popen([sys.executable, "-m", "bsresearch", "sweep", str(spec), "--runs", str(tmp_path / "runs"),
                             "--quiet", "--workers", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def one_done_one_running() -> bool:
        states = [RunDir(sweep_dir / p.run_id).state() for p in points]
        return "ok" in states and "running" in states and any(is_locked(sweep_dir / p.run_id) for p in points)

    deadline = time.monotonic() + 120
    try:
        while not one_done_one_running():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while any(is_locked(sweep_dir / p.run_id) for p in points):  # the worker and its kernel die with it
        assert time.monotonic() < deadline, "locks still held after the kill"
        time.sleep(0.1)
    # The group's kernel polls its parent and exits within a second or two of the worker, and may finish
    # the member it is training meanwhile (a finished result is kept, never lost). The next sweep waits for
    # it too (worker.PREVIOUS_OWNER_WAIT); here it is waited for before counting.
    kernels = {((RunDir(sweep_dir / p.run_id).status() or {}).get("provenance") or {}).get("pid") for p in points}
    for pid in kernels - {None}:
        assert wait_for_exit(pid, 15), "the group's kernel outlived its worker"
    finished = {p.run_id for p in points if is_complete(sweep_dir / p.run_id)}
    assert 1 <= len(finished) < len(points)
    kept = {r: {f.name: f.read_bytes() for f in (sweep_dir / r).iterdir() if f.is_file()} for r in finished}
    first_group = RunDir(sweep_dir / next(iter(finished))).status()["group"]

    report = run_sweep(spec, runs_root=tmp_path / "runs", workers=1, progress=False)
    assert report.all_finished and {o.run_id for o in report.outcomes} == {p.run_id for p in points} - finished
    assert {d.name for d in sweep_dir.iterdir() if d.is_dir()} == {p.run_id for p in points} | {"groups"}
    for r, files in kept.items():  # finished members untouched, byte for byte
        assert files == {f.name: f.read_bytes() for f in (sweep_dir / r).iterdir() if f.is_file()}
    redone = [p for p in points if p.run_id not in finished]
    for p in redone:
        status = RunDir(sweep_dir / p.run_id).status()
        assert status["state"] == "ok" and status["runner"]["attempt"] == 2
        assert (status["group"] != first_group) or len(redone) == 1  # a new group of the unfinished ones
        assert metrics_of(sweep_dir, p.run_id) == metrics_alone(p.config)


@pytest.mark.slow
def test_a_fused_group_is_one_dask_task(tmp_path, fused):
    pytest.importorskip("distributed")
    spec = write_spec(tmp_path, "dk", {"lr": [0.05, 0.2]}, seeds=(0, 1))
    report = run_sweep(spec, runs_root=tmp_path, executor="dask", workers=1, engine="library", progress=False)
    assert report.all_finished and sorted(n for _, n in calls(fused)) == [4]
    (gid, members), = report.groups.items()
    assert {RunDir(tmp_path / "dk" / r).status()["group"] for r in members} == {gid}
    assert (tmp_path / "dk" / "groups" / gid / "runner.log").exists()


@pytest.mark.slow
def test_a_group_that_times_out_or_whose_worker_dies_leaves_its_members_judged(tmp_path, tiny, monkeypatch):
    """The supervisor's verdict per member, as for a run: timeout past the group's deadline, died when the
    worker is killed; a member finished before stays finished."""
    import nbformat

    from bsresearch.sweep import supervise
    from bsresearch.sweep.executors import local_executor
    from bsresearch.sweep.task import GroupTask, RunTask
    monkeypatch.setattr(supervise, "STARTUP_GRACE", 0.0)

    def template(name: str, code: str) -> str:
        nb = nbformat.v4.new_notebook()
        params = nbformat.v4.new_code_cell("configs_json = '[]'\nrun_dirs = []\ngroup_id = None")
        params.metadata["tags"] = ["parameters"]
        nb.cells = [params, nbformat.v4.new_code_cell(code)]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nbformat.write(nb, tmp_path / name)
        return str(tmp_path / name)

    first = ("import json\nfrom bsresearch.config import RunConfig\nfrom bsresearch.train import run\n"
             "run(RunConfig.from_dict(json.loads(configs_json)[0]), run_dirs[0])\n")
    notebooks = {"slow": template("slow.ipynb", first + "import time\ntime.sleep(60)"),
                 "killed": template("killed.ipynb", first + "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                                                            "import time\ntime.sleep(30)")}
    tasks = [GroupTask(group_id=f"g-{name}", group_dir=str(tmp_path / name / "group"), notebook=nb, timeout=20.0,
                       members=tuple(RunTask(run_dir=str(tmp_path / name / str(s)), config=tiny(seed=s).to_dict(),
                                             label=f"{name} {s}") for s in range(2)))
             for name, nb in notebooks.items()]
    with local_executor(2) as pool:
        outcomes = {o.label: o for out in pool.map(supervise.run_any, tasks) for o in out}
    assert outcomes["slow 0"].state == "ok" and outcomes["killed 0"].state == "ok"
    assert outcomes["slow 1"].state == "timeout" and "timeout of its fused group g-slow" in outcomes["slow 1"].error
    assert outcomes["killed 1"].state == "died" and "killed by SIGKILL" in outcomes["killed 1"].error
    assert RunDir(tmp_path / "slow" / "1").status()["group"] == "g-slow"


def test_the_real_fused_trainer_in_a_sweep_agrees_with_fuse_off(tmp_path):
    """No stand-in: bsresearch.fused.train_group through the inline executor, against --fuse off; the
    fused trainer states agreement to float32 rounding (batched kernels sum in another order)."""
    auto = run_sweep(SMOKE, runs_root=tmp_path / "auto", executor="inline", progress=False)
    off = run_sweep(SMOKE, runs_root=tmp_path / "off", executor="inline", progress=False, fuse="off")
    assert auto.all_finished and off.all_finished and len(auto.groups) == 2
    for p in auto.planned:
        a = RunDir(tmp_path / "auto" / "smoke" / p.point.run_id).metrics()
        b = RunDir(tmp_path / "off" / "smoke" / p.point.run_id).metrics()
        assert a["steps"] == b["steps"]
        for k in ("train_loss", "test_loss"):
            assert a[k] == pytest.approx(b[k], rel=1e-4), (p.point.label, k)
        for k in ("train_acc", "test_acc"):
            assert a[k] == pytest.approx(b[k], abs=2 / 256), (p.point.label, k)  # a borderline example may flip
        assert RunDir(tmp_path / "auto" / "smoke" / p.point.run_id).status()["group"] == p.group
